/* status.h - internal: setting the thread-local last-error message. */
#ifndef RM_STATUS_H
#define RM_STATUS_H

#include "rapidmoe.h"

#if defined(__GNUC__)
#define RM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RM_PRINTF(a, b)
#endif

/* Records "fmt ..." as the last error of this thread and returns status, so that a failing path
 * reads `return rm_fail(RM_E_FORMAT, "%s: tensor '%s' ...", __func__, name);`. */
rm_status rm_fail(rm_status status, const char * fmt, ...) RM_PRINTF(2, 3);

/* Clears the last error; every public entry point that can fail calls it first. */
void rm_clear_error(void);

/* Internal invariants only, never for bad input. */
#define RM_ASSERT(x) do { if (!(x)) rm_abort_internal(__FILE__, __LINE__, #x); } while (0)
void rm_abort_internal(const char * file, int line, const char * expr);

#endif
