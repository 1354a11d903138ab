/* dispatch.c - probing the CPU, choosing the kernel set, and the per-set entry points that tests
 * and benchmarks use to run one set's kernels against the reference. */
#include "dispatch.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#if defined(RM_X86)
#include <cpuid.h>
#endif
#if defined(RM_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static const char * const isa_names[RM_ISA_COUNT] = {"scalar", "avx2", "avx512", "amx"};
#define ISA_LIST "scalar, avx2, avx512, amx"

const char * rm_isa_name(rm_isa isa) {
    return isa >= 0 && isa < RM_ISA_COUNT ? isa_names[isa] : "unknown";
}

int rm_isa_parse(const char * name, rm_isa * out) {
    for (int i = 0; i < RM_ISA_COUNT; i++) {
        if (name && strcmp(name, isa_names[i]) == 0) {
            *out = (rm_isa) i;
            return 1;
        }
    }
    return 0;
}

#if defined(RM_X86)
/* The register state the OS saves on context switches (XCR0): without it the registers exist
 * but must not be used. Read with xgetbv, valid once cpuid reports OSXSAVE. */
static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t) hi << 32) | lo;
}

/* Linux hands out the AMX tile registers only to a process that asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without the grant the first tile instruction
 * faults. The grant holds for every thread of the process. Asked once, from probe(). */
static int amx_granted(void) {
#if defined(RM_AMX) && defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;   /* built without the AMX set, or not Linux */
#endif
}

static rm_isa probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return RM_ISA_SCALAR;
    }
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) {
        return RM_ISA_SCALAR;
    }
    const uint64_t xcr = xcr0();
    if ((xcr & 0x6) != 0x6) {                     /* XMM and YMM state */
        return RM_ISA_SCALAR;
    }
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        return RM_ISA_SCALAR;
    }
    const int avx2 = (b >> 5) & 1;
    if (!(avx2 && fma && f16c)) {
        return RM_ISA_SCALAR;
    }
    const int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    const int zmm_state = (xcr & 0xe0) == 0xe0;   /* opmask, upper ZMM0-15, ZMM16-31 */
    if (!(f && dq && bw && vl && vnni && zmm_state)) {
        return RM_ISA_AVX2;
    }
    const int amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
    const int tile_state = (xcr & 0x60000) == 0x60000;   /* XTILECFG, XTILEDATA */
    return amx_tile && amx_int8 && tile_state && amx_granted() ? RM_ISA_AMX : RM_ISA_AVX512;
}

/* The CPU's vendor string and its family and model as cpuid gives them (extended fields added). */
static void cpu_identity(char vendor[13], uint32_t * family, uint32_t * model) {
    unsigned a, b, c, d;
    memset(vendor, 0, 13);
    *family = *model = 0;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        memcpy(vendor, &b, 4);
        memcpy(vendor + 4, &d, 4);
        memcpy(vendor + 8, &c, 4);
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        const uint32_t base = (a >> 8) & 0xf;
        *family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
        *model = base == 0xf || base == 0x6 ? ((a >> 4) & 0xf) | (((a >> 16) & 0xf) << 4) : (a >> 4) & 0xf;
    }
}
#else
static rm_isa probe(void) { return RM_ISA_SCALAR; }
static void cpu_identity(char vendor[13], uint32_t * family, uint32_t * model) {
    memset(vendor, 0, 13);
    *family = *model = 0;
}
#endif

/* CPUs whose best set by their flags is not their fastest, as measured on them: the set to use
 * instead, and why (a NULL vendor ends the list). RAPIDMOE_ISA still selects any set the CPU has.
 * None at present. AMD Zen 4 (family 19h), which runs each 512-bit operation as two 256-bit halves,
 * had one (avx2) while the avx512 set's prefill was a one-row form; with the tile forms its avx512
 * set is the faster: on an EPYC Zen 4, llama.cpp's Q4_K_M of the benchmark model prefilled at 610
 * against 459 tok/s and decoded at 172 against 138, Q8_0 592 against 236 and 103 against 106
 * (docs/PERFORMANCE.md). */
static const struct isa_rule {
    const char * vendor;
    uint32_t     family, model_lo, model_hi;
    rm_isa       from, to;
    const char * why;
} ISA_RULES[] = {
    {NULL, 0, 0, 0, RM_ISA_SCALAR, RM_ISA_SCALAR, NULL},
};

rm_isa rm_isa_preferred(const char * vendor, uint32_t family, uint32_t model, rm_isa best, const char ** why) {
    for (const struct isa_rule * r = ISA_RULES; r->vendor; r++) {
        if (best == r->from && strcmp(vendor, r->vendor) == 0 && family == r->family && model >= r->model_lo &&
            model <= r->model_hi) {
            *why = r->why;
            return r->to;
        }
    }
    *why = NULL;
    return best;
}

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;
static rm_isa best_isa = RM_ISA_SCALAR;
static rm_isa active_isa = RM_ISA_SCALAR;
static char   active_why[256];

static void choose_set(void);

/* The set, and for the AVX2 one whether its tiles take AVX-VNNI (rm_cpu_avx_vnni), in the reason. */
static void choose(void) {
    choose_set();
    if (active_isa == RM_ISA_AVX2) {
        const char * env = getenv("RAPIDMOE_AVX_VNNI");
        const size_t used = strlen(active_why);
        snprintf(active_why + used, sizeof(active_why) - used, "; AVX-VNNI %s",
                 rm_cpu_avx_vnni() ? "used" : env && strcmp(env, "0") == 0 ? "off (RAPIDMOE_AVX_VNNI=0)" : "not on this CPU");
    }
}

static void choose_set(void) {
    best_isa = probe();
    char vendor[13];
    uint32_t family, model;
    cpu_identity(vendor, &family, &model);
    const char * rule = NULL;
    active_isa = rm_isa_preferred(vendor, family, model, best_isa, &rule);
    if (rule) {
        snprintf(active_why, sizeof(active_why), "%s (best by the CPU's flags: %s; RAPIDMOE_ISA=%s selects it)", rule,
                 rm_isa_name(best_isa), rm_isa_name(best_isa));
    } else {
        snprintf(active_why, sizeof(active_why), "the best set this CPU and build run");
    }
    const char * want = getenv("RAPIDMOE_ISA");
    if (!want || !*want) {
        return;
    }
    rm_isa isa;
    if (!rm_isa_parse(want, &isa)) {
        fprintf(stderr, "rapidmoe: RAPIDMOE_ISA=%s is not one of " ISA_LIST "; using %s\n",
                want, rm_isa_name(active_isa));
    } else if (isa > best_isa) {
        fprintf(stderr, "rapidmoe: RAPIDMOE_ISA=%s: this CPU or build does not have it; using %s\n",
                want, rm_isa_name(active_isa));
    } else {
        active_isa = isa;
        snprintf(active_why, sizeof(active_why), "RAPIDMOE_ISA=%s", want);
    }
}

rm_isa rm_isa_best(void) {
    pthread_once(&choose_once, choose);
    return best_isa;
}

rm_isa rm_isa_active(void) {
    pthread_once(&choose_once, choose);
    return active_isa;
}

static const rm_cpu_kernels * kernels_of(rm_isa isa) {
#if defined(RM_X86)
    if (isa == RM_ISA_AVX2) return &rm_cpu_kernels_avx2;
    if (isa == RM_ISA_AVX512) return &rm_cpu_kernels_avx512;
#endif
#if defined(RM_AMX)
    if (isa == RM_ISA_AMX) return &rm_cpu_kernels_amx;
#endif
    (void) isa;
    return NULL;
}

rm_vec_dot_fn rm_cpu_vec_dot_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return NULL;
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->vec_dot[type]) return k->vec_dot[type];
    }
    const rm_type_traits * t = rm_type_traits_get(type);
    return t ? t->vec_dot : NULL;
}

rm_from_float_fn rm_cpu_quantize_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return NULL;
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->quantize[type]) return k->quantize[type];
    }
    const rm_type_traits * t = rm_type_traits_get(type);
    return t ? t->from_float : NULL;
}

rm_to_float_fn rm_cpu_dequantize_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return NULL;
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->dequantize[type]) return k->dequantize[type];
    }
    const rm_type_traits * t = rm_type_traits_get(type);
    return t ? t->to_float : NULL;
}

/* The multi-token kernel of the set whose one-token kernel vec_dot uses, so both agree bit for bit. */
rm_vec_dot_multi_fn rm_cpu_vec_dot_multi_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return NULL;
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->vec_dot[type]) return k->vec_dot_multi[type];
    }
    return NULL;
}

const rm_packed_kernels * rm_cpu_packed_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return NULL;
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->vec_dot[type]) return k->packed[type];   /* the set whose vec_dot runs */
    }
    return NULL;
}

const rm_packed_kernels * rm_cpu_stored_isa(rm_isa isa, int32_t type, int64_t n, int64_t n_rows) {
    const rm_packed_kernels * pk = rm_cpu_packed_isa(isa, type);
    const rm_tile_kernels * tk = rm_cpu_tile_isa(isa, type);
    if (!pk || (tk && !tk->reads_stored)) {   /* the set's tiles read the file's layout only (AMX's K-quants) */
        return NULL;
    }
    if (pk->repack_tile) {   /* whole tiles of rows, whole super-blocks */
        return n > 0 && n % RM_QK_K == 0 && n_rows > 0 && n_rows % RM_TILE_ROWS == 0 ? pk : NULL;
    }
    return pk->repack_row && n >= 8 * RM_QK && n % RM_QK == 0 && (pk->stored_tail || n % (8 * RM_QK) == 0) ? pk : NULL;
}

void rm_cpu_repack_rows(const rm_packed_kernels * pk, int64_t n, const void * w, uint64_t row_bytes, int64_t r0,
                        int64_t r1, void * stored) {
    for (int64_t r = r0; r < r1; r += pk->repack_tile ? RM_TILE_ROWS : 1) {
        const uint8_t * src = (const uint8_t *) w + (uint64_t) r * row_bytes;
        uint8_t * dst = (uint8_t *) stored + (uint64_t) r * row_bytes;
        if (pk->repack_tile) {
            pk->repack_tile(n, src, row_bytes, dst);
        } else {
            pk->repack_row(n, src, dst);
        }
    }
}

void rm_cpu_dot_stored(const rm_packed_kernels * pk, int64_t n, int nc, const uint8_t * stored, uint64_t row_bytes,
                       int64_t r0, int64_t r1, const uint8_t * x_t, uint64_t xt_stride, const float * x_info,
                       int64_t x_info_stride, float * y, int64_t y_stride, int accumulate) {
    if (!pk->dot_tile) {
        for (int64_t r = r0; r < r1; r++) {
            float v[RM_MULTI_MAX];
            pk->dot_stored(n, nc, v, stored + (uint64_t) r * row_bytes, x_t, xt_stride, x_info, x_info_stride);
            for (int c = 0; c < nc; c++) {
                float * o = y + (int64_t) c * y_stride + r;
                *o = accumulate ? *o + v[c] : v[c];
            }
        }
        return;
    }
    for (int64_t k0 = r0 / RM_TILE_ROWS * RM_TILE_ROWS; k0 < r1; k0 += RM_TILE_ROWS) {   /* the tiles rows r0..r1 touch */
        float v[RM_MULTI_MAX][RM_TILE_ROWS];
        pk->dot_tile(n, nc, v, stored + (uint64_t) k0 * row_bytes, x_t, xt_stride);
        const int64_t a = r0 > k0 ? r0 : k0, e = r1 < k0 + RM_TILE_ROWS ? r1 : k0 + RM_TILE_ROWS;
        for (int c = 0; c < nc; c++) {
            for (int64_t r = a; r < e; r++) {
                float * o = y + (int64_t) c * y_stride + r;
                *o = accumulate ? *o + v[c][r - k0] : v[c][r - k0];
            }
        }
    }
}

int rm_cpu_streams_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return 0;
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->vec_dot[type]) return k->streams[type];   /* the set whose vec_dot runs */
    }
    return 0;
}

const rm_tile_kernels * rm_cpu_tile_isa(rm_isa isa, int32_t type) {
    const rm_cpu_kernels * k = kernels_of(isa);
    return k && type >= 0 && type < RM_TYPE_COUNT ? k->tile[type] : NULL;
}

const rm_tile_kernels * rm_cpu_tile_below_isa(rm_isa isa, int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT) return NULL;
    const rm_vec_dot_fn dot = rm_cpu_vec_dot_isa(isa, type);
    for (int i = (int) isa - 1; i > RM_ISA_SCALAR; i--) {
        if (rm_cpu_vec_dot_isa((rm_isa) i, type) != dot) return NULL;   /* its tiles give other floats */
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->tile[type]) return k->tile[type];
    }
    return NULL;
}

const rm_tile_kernels * rm_cpu_tile_for_isa(rm_isa isa, int32_t type, int64_t n_tok) {
    const rm_tile_kernels * own = rm_cpu_tile_isa(isa, type);
    if (own && n_tok >= own->min_tokens) return own;
    const rm_tile_kernels * below = rm_cpu_tile_below_isa(isa, type);
    return below && n_tok >= below->min_tokens ? below : NULL;
}

uint64_t rm_cpu_tile_room_isa(rm_isa isa, int64_t n) {
    uint64_t most = 0;
    for (int32_t type = 0; type < RM_TYPE_COUNT; type++) {
        const rm_tile_kernels * tk[2] = {rm_cpu_tile_isa(isa, type), rm_cpu_tile_below_isa(isa, type)};
        for (int k = 0; k < 2; k++) {
            if (tk[k] && tk[k]->room_bytes(n) > most) most = tk[k]->room_bytes(n);
        }
    }
    return most;
}

void rm_q8_0_act_info(const void * x_q, int64_t n, float * info) {
    const rm_block_q8_0 * x = x_q;
    const int64_t nb = n / RM_QK;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sum = 0;
        for (int j = 0; j < RM_QK; j++) {
            sum += x[i].qs[j];
        }
        info[i] = rm_fp16_to_fp32(x[i].d);
        info[nb + i] = (float) sum;
    }
}

rm_axpy_fn rm_cpu_axpy_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->axpy) return k->axpy;
    }
    return rm_cpu_axpy_ref;
}

rm_gdn_rule_fn rm_cpu_gdn_rule_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->gdn_rule) return k->gdn_rule;
    }
    return rm_gdn_rule;
}

rm_gdn_conv_fn rm_cpu_gdn_conv_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->gdn_conv) return k->gdn_conv;
    }
    return rm_gdn_conv;
}

rm_attn_scores_fn rm_cpu_attn_scores_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->attn_scores) return k->attn_scores;
    }
    return rm_cpu_attn_scores_ref;
}

rm_attn_values_fn rm_cpu_attn_values_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->attn_values) return k->attn_values;
    }
    return rm_cpu_attn_values_ref;
}

rm_attn_scores_rows_fn rm_cpu_attn_scores_rows_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->attn_scores_rows) return k->attn_scores_rows;
    }
    return rm_cpu_attn_scores_rows_ref;
}

rm_attn_values_rows_fn rm_cpu_attn_values_rows_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->attn_values_rows) return k->attn_values_rows;
    }
    return rm_cpu_attn_values_rows_ref;
}

rm_max_fn rm_cpu_max_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->max_of) return k->max_of;
    }
    return rm_cpu_max_ref;
}

rm_exp_sum_fn rm_cpu_exp_sum_isa(rm_isa isa) {
    for (int i = isa; i > RM_ISA_SCALAR; i--) {
        const rm_cpu_kernels * k = kernels_of((rm_isa) i);
        if (k && k->exp_sum) return k->exp_sum;
    }
    return rm_cpu_exp_sum_ref;
}

/* ---------------------------------------------------------------------------------------------
 * Public entry points
 * ------------------------------------------------------------------------------------------- */

const char * rm_cpu_isa(void) { return rm_isa_name(rm_isa_active()); }

const char * rm_cpu_isa_reason(void) {
    rm_isa_active();
    return active_why;
}

int32_t rm_cpu_isa_supported(const char * isa) {
    rm_isa i;
    return rm_isa_parse(isa, &i) && i <= rm_isa_best();
}

/* The set named by `isa` (NULL: the one in use) for entry point fn, or records why not. */
static rm_status isa_arg(const char * fn, const char * isa, rm_isa * out) {
    if (isa == NULL) {
        *out = rm_isa_active();
        return RM_OK;
    }
    if (!rm_isa_parse(isa, out)) {
        return rm_fail(RM_E_INVALID_ARG, "%s: isa '%s' is not one of " ISA_LIST, fn, isa);
    }
    if (*out > rm_isa_best()) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: isa '%s' is not available on this CPU or build (best: %s)",
                       fn, isa, rm_isa_name(rm_isa_best()));
    }
    return RM_OK;
}

/* rm_vec_dot_isa in the tile form, as the CPU backend runs it: the tokens laid out once, then
 * the rows RM_TILE_ROWS at a time. */
static rm_status tile_matmul(const char * fn, const rm_tile_kernels * tk, int64_t n, const uint8_t * w, int stored,
                             uint64_t row, int64_t n_rows, const uint8_t * x_q, uint64_t xrow, int64_t n_tok, float * y) {
    void * x_t = malloc((size_t) tk->act_bytes(n, (int32_t) n_tok));
    void * room = malloc((size_t) tk->room_bytes(n));
    if (x_t == NULL || room == NULL) {
        free(x_t);
        free(room);
        return rm_fail(RM_E_OOM, "%s: no memory for %lld tokens", fn, (long long) n_tok);
    }
    for (int64_t i = 0; i < n_tok; i += RM_TILE_TOKENS) {
        const int32_t count = (int32_t) (n_tok - i < RM_TILE_TOKENS ? n_tok - i : RM_TILE_TOKENS);
        tk->put_group(n, x_q + (uint64_t) i * xrow, xrow, (int32_t) i, count, x_t);
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += RM_TILE_ROWS) {
        const int64_t r1 = r0 + RM_TILE_ROWS < n_rows ? r0 + RM_TILE_ROWS : n_rows;
        tk->matmul(n, w, stored, row, r0, r1, x_t, (int32_t) n_tok, room, y, n_rows, 0);
    }
    free(x_t);
    free(room);
    return RM_OK;
}

/* rm_vec_dot_isa in the prefill form, as the CPU backend runs it: the tokens transposed once,
 * then each row packed and passed over by eight, four, then one token at a time; rows stored
 * packed (w in the stored layout) are unpacked instead, and with fewer than RM_PACK_MIN_TOKENS
 * tokens read as they are. */
static rm_status packed_matmul(const char * fn, const rm_packed_kernels * pk, int64_t n, const uint8_t * w, int stored,
                               uint64_t row, int64_t n_rows, const uint8_t * x_q, uint64_t xrow, int64_t n_tok,
                               const float * info, int64_t info_stride, float * y) {
    const int as_stored = stored && n_tok < RM_PACK_MIN_TOKENS;
    const uint64_t xt_stride = pk->act_bytes(n);
    uint8_t * x_t = malloc((size_t) (xt_stride * (uint64_t) n_tok));
    void * packed = as_stored ? NULL : malloc((size_t) pk->packed_bytes(n));
    if (x_t == NULL || (packed == NULL && !as_stored)) {
        free(x_t);
        free(packed);
        return rm_fail(RM_E_OOM, "%s: no memory for %lld tokens", fn, (long long) n_tok);
    }
    for (int64_t i = 0; i < n_tok; i++) {
        pk->transpose_act(n, x_q + (uint64_t) i * xrow, x_t + (uint64_t) i * xt_stride);
    }
    for (int64_t i = 0; as_stored && i < n_tok;) {   /* as the CPU backend's matmul_tile_stored */
        const int nc = n_tok - i >= RM_MULTI_MAX ? RM_MULTI_MAX : pk->dot_tile ? (int) (n_tok - i) : n_tok - i >= 4 ? 4 : 1;
        rm_cpu_dot_stored(pk, n, nc, w, row, 0, n_rows, x_t + (uint64_t) i * xt_stride, xt_stride,
                          info ? info + i * info_stride : NULL, info_stride, y + i * n_rows, n_rows, 0);
        i += nc;
    }
    for (int64_t r = 0; !as_stored && r < n_rows; r++) {
        if (stored) {
            pk->unpack_stored(n, w + (uint64_t) r * row, packed);
        } else {
            pk->pack_row(n, w + (uint64_t) r * row, packed);
        }
        for (int64_t i = 0; i < n_tok;) {
            const int nc = n_tok - i >= RM_MULTI_MAX ? RM_MULTI_MAX : n_tok - i >= 4 ? 4 : 1;
            float v[RM_MULTI_MAX];
            pk->dot(n, nc, v, packed, w + (uint64_t) r * row, x_t + (uint64_t) i * xt_stride, xt_stride,
                    info ? info + i * info_stride : NULL, info_stride);
            for (int c = 0; c < nc; c++) {
                y[(i + c) * n_rows + r] = v[c];
            }
            i += nc;
        }
    }
    free(x_t);
    free(packed);
    return RM_OK;
}

/* rm_vec_dot_isa's products, w in the stored layout when `stored`. */
static rm_status vec_dot_rows(const char * fn, rm_isa which, int32_t type, const void * w, int stored, uint64_t row,
                              int64_t n_rows, const void * x_q, uint64_t xrow, int64_t n_tok, int64_t n, int batched,
                              float * y) {
    const rm_type_traits * t = rm_type_traits_get(type);
    rm_status st;
    const rm_tile_kernels * tk = batched ? rm_cpu_tile_for_isa(which, type, n_tok) : NULL;
    if (tk && n_tok <= INT32_MAX && tk->usable(n)) {
        return tile_matmul(fn, tk, n, w, stored, row, n_rows, x_q, xrow, n_tok, y);
    }
    /* as the CPU backend's matmul_tile: eight, four, then the rest at a time where there is a kernel for it,
     * with the activations' block scales and sums worked out once */
    const rm_vec_dot_fn dot = rm_cpu_vec_dot_isa(which, type);
    const rm_vec_dot_multi_fn multi = batched ? rm_cpu_vec_dot_multi_isa(which, type) : NULL;
    const int burst = rm_cpu_row_burst_isa(which, type, n_tok);
    const uint8_t * wb = w;
    const uint8_t * xb = x_q;
    float * info = NULL;
    const int64_t info_stride = 2 * (n / RM_QK);
    if (multi && t->vec_dot_type == RM_TYPE_Q8_0 && n_tok > 0) {
        info = malloc(sizeof(float) * (size_t) (info_stride * n_tok));
        if (info == NULL) return rm_fail(RM_E_OOM, "%s: no memory for %lld tokens", fn, (long long) n_tok);
        for (int64_t i = 0; i < n_tok; i++) {
            rm_q8_0_act_info(xb + (uint64_t) i * xrow, n, info + i * info_stride);
        }
    }
    /* the packed forms take Q8_0 activations with their info, or Q8_K ones as they are */
    const rm_packed_kernels * pk = info || (multi && t->vec_dot_type == RM_TYPE_Q8_K) ? rm_cpu_packed_isa(which, type) : NULL;
    if (pk && !rm_packed_form_runs(pk, n, n_tok, stored)) {
        pk = NULL;
    }
    if (stored && !pk) {   /* the caller's rows are in the stored layout: nothing else reads them */
        free(info);
        return rm_fail(RM_E_INVALID_ARG, "%s: %s: no form reads stored rows for %lld tokens", fn, t->name, (long long) n_tok);
    }
    if (pk) {
        st = packed_matmul(fn, pk, n, wb, stored, row, n_rows, xb, xrow, n_tok, info, info_stride, y);
        free(info);
        return st;
    }
    int64_t i = 0;
    for (; multi && i < n_tok; ) {
        const int nc = n_tok - i >= RM_MULTI_MAX ? RM_MULTI_MAX : n_tok - i >= 4 ? 4 : (int) (n_tok - i);
        for (int64_t r = 0; r < n_rows; r++) {
            float v[RM_MULTI_MAX];
            if (burst) rm_prefetch_row_ahead(wb + (uint64_t) r * row, row);
            multi(n, nc, v, wb + (uint64_t) r * row, xb + (uint64_t) i * xrow, xrow, info ? info + i * info_stride : NULL,
                  info_stride);
            for (int c = 0; c < nc; c++) {
                y[(i + c) * n_rows + r] = v[c];
            }
        }
        i += nc;
    }
    for (; i < n_tok; i++) {
        for (int64_t r = 0; r < n_rows; r++) {
            if (burst) rm_prefetch_row_ahead(wb + (uint64_t) r * row, row);
            dot(n, &y[i * n_rows + r], wb + (uint64_t) r * row, xb + (uint64_t) i * xrow);
        }
    }
    free(info);
    return RM_OK;
}

rm_status rm_vec_dot_isa(const char * isa, int32_t type, const void * w, uint64_t w_len, int64_t n_rows,
                         const void * x_q, uint64_t x_len, int64_t n_tok, int64_t n, int32_t batched, float * y) {
    rm_clear_error();
    rm_isa which;
    rm_status st = isa_arg(__func__, isa, &which);
    if (st != RM_OK) return st;
    const rm_type_traits * t = rm_type_traits_get(type);
    if (t == NULL) return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: ggml type %d is not supported by this build", __func__, (int) type);
    const rm_type_traits * xt = rm_type_traits_get(t->vec_dot_type);
    if (n <= 0 || n % t->block_elems != 0 || n % xt->block_elems != 0) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: n %lld is not a positive multiple of the block sizes (%d, %s %d)",
                       __func__, t->name, (long long) n, (int) t->block_elems, xt->name, (int) xt->block_elems);
    }
    if (n_rows < 0 || n_tok < 0) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: n_rows %lld, n_tok %lld", __func__, t->name, (long long) n_rows,
                       (long long) n_tok);
    }
    if (w == NULL || x_q == NULL || y == NULL) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %s is NULL", __func__, t->name,
                       w == NULL ? "w" : x_q == NULL ? "x_q" : "y");
    }
    const uint64_t row = rm_row_bytes(type, n), xrow = rm_row_bytes(t->vec_dot_type, n);
    if (n_rows > 0 && w_len / (uint64_t) n_rows < row) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %lld rows of %lld weights need %llu bytes, w has %llu", __func__,
                       t->name, (long long) n_rows, (long long) n, (unsigned long long) (row * (uint64_t) n_rows),
                       (unsigned long long) w_len);
    }
    if (n_tok > 0 && x_len / (uint64_t) n_tok < xrow) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %lld tokens of %lld activations of %s need %llu bytes, x_q has %llu",
                       __func__, t->name, (long long) n_tok, (long long) n, xt->name,
                       (unsigned long long) (xrow * (uint64_t) n_tok), (unsigned long long) x_len);
    }
    /* batched = 2: the rows repacked first, where the set keeps such rows in a stored layout; 3:
     * given so */
    const rm_packed_kernels * spk = batched >= 2 ? rm_cpu_stored_isa(which, type, n, n_rows) : NULL;
    if (batched == 3) {
        if (!spk) {
            return rm_fail(RM_E_INVALID_ARG, "%s: set %s keeps no %lld rows of %lld %s weights in a stored layout",
                           __func__, rm_isa_name(which), (long long) n_rows, (long long) n, t->name);
        }
        return vec_dot_rows(__func__, which, type, w, 1, row, n_rows, x_q, xrow, n_tok, n, 1, y);
    }
    uint8_t * stored = NULL;
    if (spk && n_rows > 0) {
        if ((stored = malloc((size_t) (row * (uint64_t) n_rows))) == NULL) {
            return rm_fail(RM_E_OOM, "%s: no memory for %lld rows", __func__, (long long) n_rows);
        }
        rm_cpu_repack_rows(spk, n, w, row, 0, n_rows, stored);
    }
    st = vec_dot_rows(__func__, which, type, stored ? stored : w, stored != NULL, row, n_rows, x_q, xrow, n_tok, n,
                      batched != 0, y);
    free(stored);
    return st;
}

rm_status rm_repack_rows_isa(const char * isa, int32_t type, const void * w, uint64_t w_len, int64_t n_rows, int64_t n,
                             void * out) {
    rm_clear_error();
    rm_isa which;
    rm_status st = isa_arg(__func__, isa, &which);
    if (st != RM_OK) return st;
    const rm_type_traits * t = rm_type_traits_get(type);
    if (t == NULL) return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: ggml type %d is not supported by this build", __func__, (int) type);
    if (n <= 0 || n % t->block_elems != 0 || n_rows < 0) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: n %lld (a positive multiple of %d), n_rows %lld", __func__, t->name,
                       (long long) n, (int) t->block_elems, (long long) n_rows);
    }
    const uint64_t row = rm_row_bytes(type, n);
    if (w == NULL || out == NULL || (n_rows > 0 && w_len / (uint64_t) n_rows < row)) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %lld rows of %lld weights need %llu bytes in w and out", __func__,
                       t->name, (long long) n_rows, (long long) n, (unsigned long long) (row * (uint64_t) n_rows));
    }
    const rm_packed_kernels * pk = rm_cpu_stored_isa(which, type, n, n_rows);
    if (pk == NULL) {
        return rm_fail(RM_E_INVALID_ARG, "%s: set %s keeps no %lld rows of %lld %s weights in a stored layout", __func__,
                       rm_isa_name(which), (long long) n_rows, (long long) n, t->name);
    }
    rm_cpu_repack_rows(pk, n, w, row, 0, n_rows, out);
    return RM_OK;
}

rm_status rm_quantize_isa(const char * isa, int32_t type, const float * x, int64_t n, void * dst, uint64_t dst_cap) {
    rm_clear_error();
    rm_isa which;
    rm_status st = isa_arg(__func__, isa, &which);
    if (st != RM_OK) return st;
    const rm_type_traits * t = rm_type_traits_get(type);
    if (t == NULL) return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: ggml type %d is not supported by this build", __func__, (int) type);
    if (n <= 0 || n % t->block_elems != 0) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: n %lld is not a positive multiple of the block size %d",
                       __func__, t->name, (long long) n, (int) t->block_elems);
    }
    if (x == NULL || dst == NULL) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %s is NULL", __func__, t->name, x == NULL ? "x" : "dst");
    }
    const uint64_t need = rm_row_bytes(type, n);
    if (dst_cap < need) {
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %lld elements need %llu bytes, dst holds %llu", __func__,
                       t->name, (long long) n, (unsigned long long) need, (unsigned long long) dst_cap);
    }
    rm_from_float_fn q = rm_cpu_quantize_isa(which, type);
    if (q == NULL) return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: type %s has no quantizer", __func__, t->name);
    q(x, dst, n);
    return RM_OK;
}
