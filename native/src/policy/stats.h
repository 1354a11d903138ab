/* stats.h - internal: what a session counts and records as it runs (rm_session_stats,
 * rm_session_last_routes, calibration and its route log); the counters live in rm_session. */
#ifndef RM_STATS_H
#define RM_STATS_H

#include "rapidmoe.h"

/* Counts the activations and residual slots of the n tokens just routed in layer il. */
void rm_stats_count(rm_session * s, int il, int32_t n);

/* Keeps layer il's routing of the batch's last token, and, while calibrating, of every token. */
void rm_stats_record_routes(rm_session * s, int il, int32_t n);

#endif
