/* types.c - the type-traits table and the public quantize / dequantize / dot entry points. */
#include "types.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "status.h"

#define REF_KERNELS(t) rm_##t##_to_float, rm_##t##_from_float, rm_##t##_vec_dot
#define DECODERS(t) rm_##t##_to_float, NULL, rm_##t##_vec_dot
#define QK_K RM_QK_K

/* The one type table: every ggml type id, keyed by id. Block geometry is ggml's (its block
 * structs in ggml-common.h; ours in types.h, whose _Static_asserts pin the sizes); it equals
 * gguf-py's GGML_QUANT_SIZES except Q8_1, which gguf-py 0.19.0 lists with the 40-byte layout ggml
 * dropped when its d and s became halves (ggml static_asserts 36). Rows without kernels are
 * types this build reads the size of but does not compute with (the GGUF reader needs them to
 * walk a file); rows with block_elems 0 are ids ggml has removed.
 *
 * Of the IQ rows IQ4_NL, IQ4_XS, IQ2_XXS and IQ3_XXS have a CUDA chunk; the GPU does not take the
 * others yet, so the planner keeps them on the host.
 *
 * name, block elems, block bytes, quantized, vec_dot type, CUDA chunk, to_float, from_float, vec_dot */
static const rm_type_traits type_traits[RM_TYPE_COUNT] = {
    [RM_TYPE_F32]  = { "F32",  1,       sizeof(float),         0, RM_TYPE_F32,  RM_CUDA_CHUNK_F32,  REF_KERNELS(f32)  },
    [RM_TYPE_F16]  = { "F16",  1,       sizeof(rm_fp16),       0, RM_TYPE_F32,  RM_CUDA_CHUNK_F16,  REF_KERNELS(f16)  },
    [RM_TYPE_BF16] = { "BF16", 1,       sizeof(rm_bf16),       0, RM_TYPE_F32,  0,                  REF_KERNELS(bf16) },
    [RM_TYPE_Q4_0] = { "Q4_0", RM_QK,   sizeof(rm_block_q4_0), 1, RM_TYPE_Q8_0, RM_CUDA_CHUNK_Q4_0, REF_KERNELS(q4_0) },
    [RM_TYPE_Q4_1] = { "Q4_1", RM_QK,   sizeof(rm_block_q4_1), 1, RM_TYPE_Q8_1, RM_CUDA_CHUNK_Q4_1, REF_KERNELS(q4_1) },
    [RM_TYPE_Q5_0] = { "Q5_0", RM_QK,   sizeof(rm_block_q5_0), 1, RM_TYPE_Q8_0, RM_CUDA_CHUNK_Q5_0, REF_KERNELS(q5_0) },
    [RM_TYPE_Q5_1] = { "Q5_1", RM_QK,   sizeof(rm_block_q5_1), 1, RM_TYPE_Q8_1, RM_CUDA_CHUNK_Q5_1, REF_KERNELS(q5_1) },
    [RM_TYPE_Q8_0] = { "Q8_0", RM_QK,   sizeof(rm_block_q8_0), 1, RM_TYPE_Q8_0, RM_CUDA_CHUNK_Q8_0, REF_KERNELS(q8_0) },
    [RM_TYPE_Q8_1] = { "Q8_1", RM_QK,   sizeof(rm_block_q8_1), 1, RM_TYPE_Q8_1, 0,                  REF_KERNELS(q8_1) },
    [RM_TYPE_Q2_K] = { "Q2_K", RM_QK_K, sizeof(rm_block_q2_K), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_Q2_K, REF_KERNELS(q2_K) },
    [RM_TYPE_Q3_K] = { "Q3_K", RM_QK_K, sizeof(rm_block_q3_K), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_Q3_K, REF_KERNELS(q3_K) },
    [RM_TYPE_Q4_K] = { "Q4_K", RM_QK_K, sizeof(rm_block_q4_K), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_Q4_K, REF_KERNELS(q4_K) },
    [RM_TYPE_Q5_K] = { "Q5_K", RM_QK_K, sizeof(rm_block_q5_K), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_Q5_K, REF_KERNELS(q5_K) },
    [RM_TYPE_Q6_K] = { "Q6_K", RM_QK_K, sizeof(rm_block_q6_K), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_Q6_K, REF_KERNELS(q6_K) },
    [RM_TYPE_Q8_K] = { "Q8_K", RM_QK_K, sizeof(rm_block_q8_K), 1, RM_TYPE_Q8_K, 0,                  REF_KERNELS(q8_K) },
    [RM_TYPE_MXFP4] = { "MXFP4", RM_QK, sizeof(rm_block_mxfp4), 1, RM_TYPE_Q8_0, RM_CUDA_CHUNK_MXFP4, REF_KERNELS(mxfp4) },
    /* read, computed and written; the quantizer takes an importance */
    [RM_TYPE_IQ2_XXS] = { "IQ2_XXS", QK_K,  sizeof(rm_block_iq2_xxs), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_IQ2_XXS, REF_KERNELS(iq2_xxs), rm_iq2_xxs_quantize },
    [RM_TYPE_IQ3_XXS] = { "IQ3_XXS", QK_K,  sizeof(rm_block_iq3_xxs), 1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_IQ3_XXS, REF_KERNELS(iq3_xxs), rm_iq3_xxs_quantize },
    [RM_TYPE_IQ4_NL]  = { "IQ4_NL",  RM_QK, sizeof(rm_block_iq4_nl),  1, RM_TYPE_Q8_0, RM_CUDA_CHUNK_IQ4_NL, REF_KERNELS(iq4_nl), rm_iq4_nl_quantize },
    /* read and computed, not written: no quantizer */
    [RM_TYPE_IQ2_XS]  = { "IQ2_XS",  QK_K,  sizeof(rm_block_iq2_xs),  1, RM_TYPE_Q8_K, 0, DECODERS(iq2_xs)  },
    [RM_TYPE_IQ1_S]   = { "IQ1_S",   QK_K,  sizeof(rm_block_iq1_s),   1, RM_TYPE_Q8_K, 0, DECODERS(iq1_s)   },
    [RM_TYPE_IQ3_S]   = { "IQ3_S",   QK_K,  sizeof(rm_block_iq3_s),   1, RM_TYPE_Q8_K, 0, DECODERS(iq3_s)   },
    [RM_TYPE_IQ2_S]   = { "IQ2_S",   QK_K,  sizeof(rm_block_iq2_s),   1, RM_TYPE_Q8_K, 0, DECODERS(iq2_s)   },
    [RM_TYPE_IQ4_XS]  = { "IQ4_XS",  QK_K,  sizeof(rm_block_iq4_xs),  1, RM_TYPE_Q8_K, RM_CUDA_CHUNK_IQ4_XS, DECODERS(iq4_xs)  },
    [RM_TYPE_IQ1_M]   = { "IQ1_M",   QK_K,  sizeof(rm_block_iq1_m),   1, RM_TYPE_Q8_K, 0, DECODERS(iq1_m)   },
    /* read, not computed: sizes only */
    [4]  = { "Q4_2" },
    [5]  = { "Q4_3" },
    [24] = { "I8",      1,    1 },
    [25] = { "I16",     1,    2 },
    [26] = { "I32",     1,    4 },
    [27] = { "I64",     1,    8 },
    [28] = { "F64",     1,    8 },
    [31] = { "Q4_0_4_4" },
    [32] = { "Q4_0_4_8" },
    [33] = { "Q4_0_8_8" },
    [34] = { "TQ1_0",   QK_K, 2 + 4*13,                             1 },
    [35] = { "TQ2_0",   QK_K, 2 + 64,                               1 },
    [36] = { "IQ4_NL_4_4" },
    [37] = { "IQ4_NL_4_8" },
    [38] = { "IQ4_NL_8_8" },
    [40] = { "NVFP4",   64,   4 + 32,                               1 },
    [41] = { "Q1_0",    128,  2 + 16,                               1 },
    [42] = { "Q2_0",    64,   2 + 16,                               1 },
};

const rm_type_traits * rm_type_traits_any(int32_t type) {
    if (type < 0 || type >= RM_TYPE_COUNT || type_traits[type].name == NULL) return NULL;
    return &type_traits[type];
}

const rm_type_traits * rm_type_traits_get(int32_t type) {
    const rm_type_traits * t = rm_type_traits_any(type);
    return t != NULL && t->to_float != NULL ? t : NULL;
}

/* Looks the type up for entry point `fn`, or records why not. */
static const rm_type_traits * lookup(const char * fn, int32_t type) {
    const rm_type_traits * t = rm_type_traits_get(type);
    if (t == NULL) rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: ggml type %d is not supported by this build", fn, (int)type);
    return t;
}

/* Checks that n elements of t are a whole, positive number of blocks. */
static rm_status check_elems(const char * fn, const rm_type_traits * t, const char * what, int64_t n) {
    if (n <= 0) return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %s is %lld, must be > 0", fn, t->name, what, (long long)n);
    if (n % t->block_elems != 0)
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %s %lld is not a multiple of the block size %d",
                       fn, t->name, what, (long long)n, (int)t->block_elems);
    return RM_OK;
}

static uint64_t bytes_of(const rm_type_traits * t, int64_t n) {
    return (uint64_t)(n / t->block_elems) * (uint64_t)t->block_bytes;
}

static void describe(const rm_type_traits * t, rm_type_info * out) {
    *out = (rm_type_info){
        .name = t->name,
        .block_elems = t->block_elems,
        .block_bytes = t->block_bytes,
        .is_quantized = t->is_quantized,
        .vec_dot_type = t->to_float != NULL ? t->vec_dot_type : -1,
        .can_quantize = t->from_float != NULL,
        .implemented = t->to_float != NULL,
        .cuda_matmul_chunk = t->cuda_chunk,
        .takes_importance = t->quantize_imp != NULL,
    };
}

rm_status rm_type_describe(int32_t type, rm_type_info * out) {
    rm_clear_error();
    const rm_type_traits * t = lookup(__func__, type);
    if (t == NULL) return RM_E_UNSUPPORTED_TYPE;
    if (out == NULL) return rm_fail(RM_E_INVALID_ARG, "%s: out is NULL", __func__);
    describe(t, out);
    return RM_OK;
}

rm_status rm_type_describe_any(int32_t type, rm_type_info * out) {
    rm_clear_error();
    if (out == NULL) return rm_fail(RM_E_INVALID_ARG, "%s: out is NULL", __func__);
    const rm_type_traits * t = rm_type_traits_any(type);
    if (t == NULL)
        return rm_fail(RM_E_INVALID_ARG, "%s: %d is not a ggml type id (0 to %d)", __func__, (int)type, RM_TYPE_COUNT - 1);
    if (t->block_elems == 0) {
        *out = (rm_type_info){.name = t->name, .vec_dot_type = -1};   /* the name, for messages */
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: ggml type %d (%s) has been removed from ggml", __func__, (int)type, t->name);
    }
    describe(t, out);
    return RM_OK;
}

uint64_t rm_row_bytes(int32_t type, int64_t n) {
    const rm_type_traits * t = rm_type_traits_get(type);
    if (t == NULL || n < 0 || n % t->block_elems != 0) return 0;
    return bytes_of(t, n);
}

/* ---------------------------------------------------------------------------------------------
 * rm_quantize: every type quantizes its blocks independently, so the input is one long run of
 * blocks (rows are whole blocks) and each thread takes a contiguous share of them.
 * ------------------------------------------------------------------------------------------- */

/* Below this many elements per thread, starting a thread costs more than it saves. */
#define QUANTIZE_MIN_ELEMS_PER_THREAD (1 << 16)

typedef struct quantize_job {
    const rm_type_traits * t;
    const float *    src;
    uint8_t *        dst;
    int64_t          n;           /* elements, a whole number of blocks */
    const float *    imp;         /* NULL, or the importance of each of a row's n_per_row columns */
    int64_t          n_per_row;
    int64_t          col0;        /* column of src[0] */
} quantize_job;

/* With an importance, the run is cut at row ends, so that each piece reads its columns' weights
 * from one stretch of imp. */
static void * quantize_worker(void * arg) {
    const quantize_job * job = arg;
    if (job->imp == NULL) {
        job->t->from_float(job->src, job->dst, job->n);
        return NULL;
    }
    const size_t bytes_per_elem_block = (size_t)job->t->block_bytes;
    int64_t done = 0, col = job->col0;
    while (done < job->n) {
        int64_t len = job->n_per_row - col;
        if (len > job->n - done) len = job->n - done;
        job->t->quantize_imp(job->src + done, job->dst + (size_t)(done / job->t->block_elems) * bytes_per_elem_block,
                             len, job->imp + col);
        done += len;
        col = 0;
    }
    return NULL;
}

static int online_cpus(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

rm_status rm_quantize(int32_t type, const float * src, int64_t n_rows, int64_t n_per_row,
                      void * dst, uint64_t dst_cap, int32_t n_threads) {
    return rm_quantize_weighted(type, src, n_rows, n_per_row, NULL, dst, dst_cap, n_threads);
}

rm_status rm_quantize_weighted(int32_t type, const float * src, int64_t n_rows, int64_t n_per_row,
                               const float * importance, void * dst, uint64_t dst_cap, int32_t n_threads) {
    rm_clear_error();
    const rm_type_traits * t = lookup("rm_quantize", type);
    if (t == NULL) return RM_E_UNSUPPORTED_TYPE;
    if (t->from_float == NULL) return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_quantize: type %s has no quantizer", t->name);
    if (importance != NULL && t->quantize_imp == NULL)
        return rm_fail(RM_E_INVALID_ARG, "rm_quantize: type %s's quantizer takes no importance", t->name);
    rm_status st = check_elems("rm_quantize", t, "n_per_row", n_per_row);
    if (st != RM_OK) return st;
    if (n_rows < 0) return rm_fail(RM_E_INVALID_ARG, "rm_quantize: type %s: n_rows is %lld, must be >= 0", t->name, (long long)n_rows);
    if (n_rows > 0 && n_per_row > INT64_MAX / n_rows)
        return rm_fail(RM_E_INVALID_ARG, "rm_quantize: type %s: %lld rows of %lld elements overflow",
                       t->name, (long long)n_rows, (long long)n_per_row);
    if (src == NULL || dst == NULL)
        return rm_fail(RM_E_INVALID_ARG, "rm_quantize: type %s: %s is NULL", t->name, src == NULL ? "src" : "dst");
    for (int64_t c = 0; importance != NULL && c < n_per_row; ++c)
        if (!(importance[c] >= 0) || isinf(importance[c]))
            return rm_fail(RM_E_INVALID_ARG, "rm_quantize: type %s: importance[%lld] is %g; it must be finite and >= 0",
                           t->name, (long long)c, (double)importance[c]);
    const int64_t n = n_rows * n_per_row;
    const uint64_t need = bytes_of(t, n);
    if (dst_cap < need)
        return rm_fail(RM_E_INVALID_ARG, "rm_quantize: type %s: %lld rows of %lld elements need %llu bytes, dst holds %llu",
                       t->name, (long long)n_rows, (long long)n_per_row,
                       (unsigned long long)need, (unsigned long long)dst_cap);
    if (n == 0) return RM_OK;

    const int64_t n_blocks = n / t->block_elems;
    int64_t threads = n_threads > 0 ? n_threads : online_cpus();
    const int64_t useful = (n + QUANTIZE_MIN_ELEMS_PER_THREAD - 1) / QUANTIZE_MIN_ELEMS_PER_THREAD;
    if (threads > useful) threads = useful;
    if (threads > n_blocks) threads = n_blocks;
    if (threads > 256) threads = 256;

    quantize_job jobs[256];
    pthread_t tids[256];
    int started[256] = {0};
    for (int64_t k = 0; k < threads; ++k) {
        const int64_t b0 = n_blocks * k / threads, b1 = n_blocks * (k + 1) / threads;
        jobs[k] = (quantize_job){
            .t = t,
            .src = src + b0 * t->block_elems,
            .dst = (uint8_t *)dst + (uint64_t)b0 * (uint64_t)t->block_bytes,
            .n = (b1 - b0) * t->block_elems,
            .imp = importance,
            .n_per_row = n_per_row,
            .col0 = b0 * t->block_elems % n_per_row,
        };
    }
    /* job 0 runs here; a thread that fails to start has its job run here too */
    for (int64_t k = 1; k < threads; ++k) started[k] = pthread_create(&tids[k], NULL, quantize_worker, &jobs[k]) == 0;
    quantize_worker(&jobs[0]);
    for (int64_t k = 1; k < threads; ++k) {
        if (started[k]) pthread_join(tids[k], NULL);
        else quantize_worker(&jobs[k]);
    }
    return RM_OK;
}

rm_status rm_dequantize(int32_t type, const void * src, uint64_t src_len, float * dst, int64_t n) {
    rm_clear_error();
    const rm_type_traits * t = lookup(__func__, type);
    if (t == NULL) return RM_E_UNSUPPORTED_TYPE;
    rm_status st = check_elems(__func__, t, "n", n);
    if (st != RM_OK) return st;
    if (src == NULL || dst == NULL)
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %s is NULL", __func__, t->name, src == NULL ? "src" : "dst");
    const uint64_t need = bytes_of(t, n);
    if (src_len < need)
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %lld elements need %llu bytes, src has %llu",
                       __func__, t->name, (long long)n, (unsigned long long)need, (unsigned long long)src_len);
    t->to_float(src, dst, n);
    return RM_OK;
}

rm_status rm_vec_dot(int32_t type, const void * w, uint64_t w_len, const float * x, int64_t n, float * out) {
    rm_clear_error();
    const rm_type_traits * t = lookup(__func__, type);
    if (t == NULL) return RM_E_UNSUPPORTED_TYPE;
    rm_status st = check_elems(__func__, t, "n", n);
    if (st != RM_OK) return st;
    if (w == NULL || x == NULL || out == NULL)
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %s is NULL", __func__, t->name,
                       w == NULL ? "w" : x == NULL ? "x" : "out");
    const uint64_t need = bytes_of(t, n);
    if (w_len < need)
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: %lld weights need %llu bytes, w has %llu",
                       __func__, t->name, (long long)n, (unsigned long long)need, (unsigned long long)w_len);
    const rm_type_traits * xt = rm_type_traits_get(t->vec_dot_type);
    RM_ASSERT(xt != NULL && xt->from_float != NULL);
    if (n % xt->block_elems != 0)
        return rm_fail(RM_E_INVALID_ARG, "%s: type %s: n %lld is not a multiple of the activation type %s's block size %d",
                       __func__, t->name, (long long)n, xt->name, (int)xt->block_elems);
    if (t->vec_dot_type == RM_TYPE_F32) {
        t->vec_dot(n, out, w, x);
        return RM_OK;
    }
    void * x_q = malloc(bytes_of(xt, n));
    if (x_q == NULL) return rm_fail(RM_E_OOM, "%s: type %s: no memory for %lld activations", __func__, t->name, (long long)n);
    xt->from_float(x, x_q, n);
    t->vec_dot(n, out, w, x_q);
    free(x_q);
    return RM_OK;
}
