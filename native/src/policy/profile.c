/* profile.c - the profiler: host wall time per part of the forward pass (rm_session_profile). */
#include "profile.h"

#include <string.h>
#include <time.h>

#include "session.h"
#include "status.h"

double rm_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec * 1e-3;
}

void rm_prof_begin(rm_session * s, int32_t n) {
    s->prof.kind = n > 1;
    s->prof.tokens[s->prof.kind] += (uint64_t) n;
    s->prof.t = rm_now_us();
}

void rm_prof_mark(rm_session * s, int part) {
    const double t = rm_now_us();
    s->prof.us[s->prof.kind][part] += t - s->prof.t;
    s->prof.t = t;
}

void rm_prof_clear(rm_session * s) {
    memset(s->prof.us, 0, sizeof(s->prof.us));
    memset(s->prof.tokens, 0, sizeof(s->prof.tokens));
}

static const char * const PROF_NAMES[RM_PROF_COUNT] = {
    "embed", "attn_in", "attn", "attn_out", "router", "experts_in", "experts_out", "experts_other", "shared", "output",
};

const char * rm_profile_part_name(int32_t part) {
    return part >= 0 && part < RM_PROF_COUNT ? PROF_NAMES[part] : NULL;
}

rm_status rm_session_profile(const rm_session * s, double * us, int32_t cap, uint64_t * tokens) {
    rm_clear_error();
    if (!s || !us || !tokens) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_profile: NULL argument");
    }
    if (cap < 2 * RM_PROF_COUNT) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_profile: us holds %d entries, %d needed", cap, 2 * RM_PROF_COUNT);
    }
    memcpy(us, s->prof.us, sizeof(s->prof.us));
    tokens[0] = s->prof.tokens[0];
    tokens[1] = s->prof.tokens[1];
    return RM_OK;
}
