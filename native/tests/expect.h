/* expect.h - the check every C test program uses: count, and report a failure with its place. */
#ifndef RM_TEST_EXPECT_H
#define RM_TEST_EXPECT_H

#include <stdio.h>

static int n_passed, n_failed;

#define EXPECT(cond, ...)                                              \
    do {                                                               \
        if (cond) {                                                    \
            ++n_passed;                                                \
        } else {                                                       \
            ++n_failed;                                                \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                \
            printf(__VA_ARGS__);                                       \
            printf("\n");                                              \
        }                                                              \
    } while (0)

#endif
