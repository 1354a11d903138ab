/* profile.h - internal: where a session's evaluation time goes (rm_session_profile), part by part
 * of the forward pass, decode and prefill apart. */
#ifndef RM_PROFILE_H
#define RM_PROFILE_H

#include "rapidmoe.h"

typedef struct rm_profile {
    double   us[2][RM_PROF_COUNT];  /* [0] decode (batches of one token), [1] prefill */
    uint64_t tokens[2];
    double   t;                     /* when the current part began, microseconds */
    int      kind;                  /* which of the two the current batch is */
} rm_profile;

/* A monotonic clock in microseconds. */
double rm_now_us(void);

/* Starts the profile of a batch of n tokens (its time until the first mark goes nowhere). */
void rm_prof_begin(rm_session * s, int32_t n);

/* Ends the current part of the profile (its time since the last mark goes to `part`). */
void rm_prof_mark(rm_session * s, int part);

/* Zeroes the times and token counts (rm_session_clear_stats). */
void rm_prof_clear(rm_session * s);

#endif
