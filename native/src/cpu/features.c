/* features.c - CPU features that kernels ask about themselves, apart from the choice of kernel
 * set (dispatch.c): the kernel files call these, and dispatch.c calls the kernel files, so they
 * live in a unit of their own. */
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

#if defined(RM_X86)
#include <cpuid.h>

static int probe_avx_vnni(void) {
    uint32_t a, b, c, d;
    const char * env = getenv("RAPIDMOE_AVX_VNNI");
    if (env && strcmp(env, "0") == 0) {
        return 0;
    }
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1);
}
#else
static int probe_avx_vnni(void) { return 0; }
#endif

int rm_cpu_avx_vnni(void) {
    static int known = -1;   /* the same answer whichever thread asks first */
    int v = __atomic_load_n(&known, __ATOMIC_ACQUIRE);
    if (v < 0) {
        v = probe_avx_vnni();
        __atomic_store_n(&known, v, __ATOMIC_RELEASE);
    }
    return v;
}

