/* test_cuda_dequant.cu - the CUDA kernels' dequantizers (rm_cu_dequant_chunk, matmul.cuh) run on
 * the host against the C reference (rm_dequantize), chunk by chunk, on random rows of every type
 * the kernels take. They are the same source the device compiles, so their indexing (the part
 * that goes wrong) is checked on a machine without a GPU. Expected: bit-identical floats.
 *
 * Two kinds of rows: quantized from random floats (types with a quantizer), and random bytes with
 * each block's fp16 scales set to random non-zero finite values (the types added after Q4_K and
 * MXFP4, the IQ ones included, which have no quantizer): these reach every bit pattern of the
 * levels and scales, not only those a quantizer writes. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.cuh"
#include "tiny_gguf.h"

static int n_passed, n_failed;

/* Byte offsets of a block's fp16 fields (scales and mins), -1 ending the list. */
struct half_fields { int32_t type; int off[3]; };
static const half_fields HALVES[] = {
    {RM_TYPE_Q4_1, {0, 2, -1}},
    {RM_TYPE_Q5_0, {0, -1}},
    {RM_TYPE_Q5_1, {0, 2, -1}},
    {RM_TYPE_Q5_K, {0, 2, -1}},
    {RM_TYPE_Q6_K, {(int) offsetof(rm_block_q6_K, d), -1}},
    {RM_TYPE_IQ4_NL, {0, -1}},
    {RM_TYPE_IQ4_XS, {0, -1}},
    {RM_TYPE_IQ2_XXS, {0, -1}},
    {RM_TYPE_IQ3_XXS, {0, -1}},
};

static uint64_t next_u64(uint64_t * s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* rows of random blocks: random bytes, fp16 fields a random non-zero finite value */
static int fill_random(int32_t type, uint8_t * q, uint64_t bytes, uint64_t * rng) {
    const half_fields * h = NULL;
    for (size_t i = 0; i < sizeof(HALVES) / sizeof(HALVES[0]); i++)
        if (HALVES[i].type == type) h = &HALVES[i];
    if (h == NULL) return 0;
    for (uint64_t i = 0; i < bytes; i++) q[i] = (uint8_t) (next_u64(rng) >> 24);
    const uint64_t bb = rm_type_traits_get(type)->block_bytes;
    for (uint64_t b = 0; b < bytes / bb; b++) {
        for (int k = 0; h->off[k] >= 0; k++) {
            uint16_t v = 0;
            while ((v & 0x7FFF) == 0) v = rm_fp32_to_fp16(tiny_gauss(rng) * 0.01f);
            memcpy(q + b * bb + h->off[k], &v, sizeof(v));
        }
    }
    return 1;
}

/* random: 0 quantizes random floats, 1 writes random blocks (fill_random) */
template <int T>
static void check(const char * name, int64_t n, uint64_t * rng, int random = 0) {
    constexpr int C = rm_cu_chunk<T>::n;
    const int rows = 7;
    float * x = (float *) malloc(sizeof(float) * n * rows);
    for (int64_t i = 0; i < n * rows; i++) x[i] = tiny_gauss(rng) * (1.0f + (float) (i % 97) / 16.0f);
    const uint64_t rb = rm_row_bytes(T, n);
    uint8_t * q = (uint8_t *) malloc(rb * rows);
    float * ref = (float *) malloc(sizeof(float) * n);
    int bad = 0;
    if (random && !fill_random(T, q, rb * rows, rng)) {
        printf("FAIL %s: no fp16 fields listed for random blocks\n", name);
        bad = 1;
    } else if (!random && rm_quantize(T, x, rows, n, q, rb * rows, 1) != RM_OK) {
        printf("FAIL %s: quantize: %s\n", name, rm_last_error());
        bad = 1;
    }
    for (int r = 0; r < rows && !bad; r++) {
        rm_dequantize(T, q + r * rb, rb, ref, n);
        for (int64_t c = 0; c < n / C && !bad; c++) {
            float got[C];
            rm_cu_dequant_chunk<T>(q + r * rb, c, got);
            for (int j = 0; j < C; j++) {
                if (memcmp(&got[j], &ref[c * C + j], sizeof(float)) != 0) {
                    printf("FAIL %s%s: row %d element %lld: %.9g, reference %.9g\n", name,
                           random ? " (random blocks)" : "", r, (long long) (c * C + j), got[j], ref[c * C + j]);
                    bad = 1;
                    break;
                }
            }
        }
    }
    bad ? ++n_failed : ++n_passed;
    free(x), free(q), free(ref);
}

/* The device's copies of the IQ tables are what the compiler builds from iq_grids.h's arrays
 * (RM_CU_DEVICE_TABLE); the host can run the same builders and compare. */
static void check_device_tables(void) {
    static constexpr rm_cu_iq4nl_dev_t iq4nl = rm_cu_iq4nl_dev_make();
    static constexpr rm_cu_ksigns_dev_t ksigns = rm_cu_ksigns_dev_make();
    static constexpr rm_cu_iq2xxs_dev_t iq2xxs = rm_cu_iq2xxs_dev_make();
    static constexpr rm_cu_iq3xxs_dev_t iq3xxs = rm_cu_iq3xxs_dev_make();
    const struct { const char * name; const void * dev, * host; size_t n; } t[] = {
        {"iq4nl_values", iq4nl.v, rm_iq4nl_values, sizeof(rm_iq4nl_values)},
        {"ksigns", ksigns.v, rm_iq_ksigns, sizeof(rm_iq_ksigns)},
        {"iq2xxs_grid", iq2xxs.v, rm_iq2xxs_grid, sizeof(rm_iq2xxs_grid)},
        {"iq3xxs_grid", iq3xxs.v, rm_iq3xxs_grid, sizeof(rm_iq3xxs_grid)},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        const int ok = memcmp(t[i].dev, t[i].host, t[i].n) == 0;
        if (!ok) printf("FAIL device table %s differs from iq_grids.h\n", t[i].name);
        ok ? ++n_passed : ++n_failed;
    }
}

int main(void) {
    uint64_t rng = 42;
    check_device_tables();
    const int64_t widths[] = {256, 512, 2048};
    for (int w = 0; w < 3; w++) {
        const int64_t n = widths[w];
        check<RM_TYPE_F32>("F32", n, &rng);
        check<RM_TYPE_F16>("F16", n, &rng);
        check<RM_TYPE_Q4_0>("Q4_0", n, &rng);
        check<RM_TYPE_Q8_0>("Q8_0", n, &rng);
        check<RM_TYPE_Q2_K>("Q2_K", n, &rng);
        check<RM_TYPE_Q3_K>("Q3_K", n, &rng);
        check<RM_TYPE_Q4_K>("Q4_K", n, &rng);
        check<RM_TYPE_MXFP4>("MXFP4", n, &rng);
        check<RM_TYPE_Q6_K>("Q6_K", n, &rng);
        check<RM_TYPE_Q5_K>("Q5_K", n, &rng);
        check<RM_TYPE_Q5_0>("Q5_0", n, &rng);
        check<RM_TYPE_Q4_1>("Q4_1", n, &rng);
        check<RM_TYPE_Q5_1>("Q5_1", n, &rng);
        check<RM_TYPE_Q6_K>("Q6_K", n, &rng, 1);
        check<RM_TYPE_Q5_K>("Q5_K", n, &rng, 1);
        check<RM_TYPE_Q5_0>("Q5_0", n, &rng, 1);
        check<RM_TYPE_IQ4_XS>("IQ4_XS", n, &rng, 1);
        check<RM_TYPE_IQ4_NL>("IQ4_NL", n, &rng, 1);
        check<RM_TYPE_Q4_1>("Q4_1", n, &rng, 1);
        check<RM_TYPE_Q5_1>("Q5_1", n, &rng, 1);
        check<RM_TYPE_IQ2_XXS>("IQ2_XXS", n, &rng, 1);
        check<RM_TYPE_IQ3_XXS>("IQ3_XXS", n, &rng, 1);
    }
    printf("test_cuda_dequant: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
