/* test_quants.c - every type through the public API on deterministic pseudo-random data:
 * quantize (one thread and several), dequantize, vec_dot against a double dot of the
 * dequantized row, and the error paths. Types without a quantizer (the IQ family) take random
 * blocks instead. Meant to run under AddressSanitizer/UBSan too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rapidmoe.h"
#include "expect.h"



/* xorshift64* and Box-Muller: the same numbers on every machine */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform01(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-53;
}

static float gaussian(void) {
    const double u = uniform01() + 0x1p-60, v = uniform01();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Relative round-trip RMSE on N(0, 1) data, with headroom; the pytest suite holds the tight budgets. */
static double rmse_bound(int32_t type) {
    switch (type) {
        case RM_TYPE_F32:  return 1e-7;
        case RM_TYPE_F16:  return 1e-3;
        case RM_TYPE_BF16: return 5e-3;
        case RM_TYPE_Q2_K: return 0.35;
        case RM_TYPE_Q3_K: return 0.2;
        case RM_TYPE_Q4_0: case RM_TYPE_Q4_1: case RM_TYPE_Q4_K: return 0.1;
        case RM_TYPE_Q5_0: case RM_TYPE_Q5_1: case RM_TYPE_Q5_K: return 0.05;
        case RM_TYPE_Q6_K: return 0.025;
        case RM_TYPE_MXFP4: return 0.13;   /* 4 bits with a power-of-two scale: measured 0.115 */
        case RM_TYPE_IQ2_XXS: return 0.36; /* a codebook of 256 per 8 weights: measured 0.347 */
        case RM_TYPE_IQ3_XXS: return 0.19; /* measured 0.179 */
        case RM_TYPE_IQ4_NL: return 0.08;  /* 16 non-linear levels: measured 0.0764 */
        default:           return 0.01;  /* the 8-bit types */
    }
}

/* Random blocks of a type without a quantizer: random bytes with the fp16 super-block scale d set
 * to 0.01, so that every value is finite. d is each IQ block's first field but IQ1_M's, which
 * keeps it in the top nibbles of its four scale words (the block's last 8 bytes). */
static void random_blocks(int32_t type, const rm_type_info * info, uint8_t * q, int64_t n_blocks) {
    const uint16_t d = 0x211F;  /* 0.01 as fp16 */
    for (int64_t b = 0; b < n_blocks; ++b) {
        uint8_t * block = q + b * info->block_bytes;
        for (int i = 0; i < info->block_bytes; ++i) block[i] = (uint8_t)(uniform01() * 256);
        if (type == RM_TYPE_IQ1_M) {
            for (int k = 0; k < 4; ++k) {
                uint16_t w;
                memcpy(&w, block + info->block_bytes - 8 + 2 * k, 2);
                w = (uint16_t)((w & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12));
                memcpy(block + info->block_bytes - 8 + 2 * k, &w, 2);
            }
        } else {
            memcpy(block, &d, 2);
        }
    }
}

static void test_type(int32_t type, const rm_type_info * info, const float * x, const float * act,
                      int64_t n_rows, int64_t n) {
    const uint64_t row = rm_row_bytes(type, n);
    EXPECT(row == (uint64_t)(n / info->block_elems) * (uint64_t)info->block_bytes, "%s: row bytes %llu",
           info->name, (unsigned long long)row);
    uint8_t * q1 = malloc(row * n_rows);
    uint8_t * q4 = malloc(row * n_rows);
    float * y = malloc(sizeof(float) * n * n_rows);

    double rel = NAN;
    if (info->can_quantize) {
        EXPECT(rm_quantize(type, x, n_rows, n, q1, row * n_rows, 1) == RM_OK, "%s: quantize: %s", info->name, rm_last_error());
        EXPECT(rm_quantize(type, x, n_rows, n, q4, row * n_rows, 4) == RM_OK, "%s: quantize x4: %s", info->name, rm_last_error());
        EXPECT(memcmp(q1, q4, row * n_rows) == 0, "%s: threads changed the bytes", info->name);
    } else {
        EXPECT(rm_quantize(type, x, n_rows, n, q1, row * n_rows, 1) == RM_E_UNSUPPORTED_TYPE, "%s: quantize refused", info->name);
        EXPECT(strstr(rm_last_error(), "has no quantizer") != NULL, "%s: message: %s", info->name, rm_last_error());
        random_blocks(type, info, q1, (int64_t)(row / (uint64_t)info->block_bytes) * n_rows);
    }

    EXPECT(rm_dequantize(type, q1, row * n_rows, y, n * n_rows) == RM_OK, "%s: dequantize: %s", info->name, rm_last_error());
    if (info->can_quantize) {
        double se = 0, ss = 0;
        for (int64_t i = 0; i < n * n_rows; ++i) {
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            ss += (double)x[i] * x[i];
        }
        rel = sqrt(se / ss);
        EXPECT(rel < rmse_bound(type), "%s: round-trip relative rmse %.4f >= %.4f", info->name, rel, rmse_bound(type));
    } else {
        int finite = 1;
        for (int64_t i = 0; i < n * n_rows; ++i) finite &= isfinite(y[i]) != 0;
        EXPECT(finite, "%s: random blocks dequantize to finite values", info->name);
    }

    /* vec_dot of each row against one activation row, vs a double dot of the dequantized row */
    double worst = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
        float got = NAN;
        EXPECT(rm_vec_dot(type, q1 + r * row, row, act, n, &got) == RM_OK, "%s: vec_dot: %s", info->name, rm_last_error());
        double want = 0, ww = 0, xx = 0;
        for (int64_t i = 0; i < n; ++i) {
            want += (double)y[r * n + i] * act[i];
            ww += (double)y[r * n + i] * y[r * n + i];
            xx += (double)act[i] * act[i];
        }
        const double err = fabs(got - want) / sqrt(ww * xx);
        if (!(err <= worst)) worst = err;
    }
    const double tol = info->vec_dot_type == RM_TYPE_F32 ? 1e-6 : 2e-3;
    EXPECT(worst < tol, "%s: vec_dot error %.2e >= %.0e (relative to |w| |x|)", info->name, worst, tol);
    if (info->can_quantize) printf("ok %-7s rmse %.4f vec_dot err %.1e\n", info->name, rel, worst);
    else printf("ok %-7s random blocks, vec_dot err %.1e\n", info->name, worst);

    free(q1);
    free(q4);
    free(y);
}

static void test_errors(void) {
    float x[512] = {0}, y[512];
    uint8_t q[1024];
    float out;
    EXPECT(rm_quantize(40, x, 1, 256, q, sizeof(q), 1) == RM_E_UNSUPPORTED_TYPE, "NVFP4 quantize");
    EXPECT(strstr(rm_last_error(), "type 40") != NULL, "message: %s", rm_last_error());
    EXPECT(rm_quantize(-3, x, 1, 256, q, sizeof(q), 1) == RM_E_UNSUPPORTED_TYPE, "negative type");
    EXPECT(rm_quantize(RM_TYPE_COUNT, x, 1, 256, q, sizeof(q), 1) == RM_E_UNSUPPORTED_TYPE, "type past the end");
    EXPECT(rm_quantize(RM_TYPE_Q4_K, x, 1, 100, q, sizeof(q), 1) == RM_E_INVALID_ARG, "row not whole blocks");
    EXPECT(strstr(rm_last_error(), "rm_quantize: type Q4_K: n_per_row 100") != NULL, "message: %s", rm_last_error());
    EXPECT(rm_quantize(RM_TYPE_Q4_K, x, 2, 256, q, 287, 1) == RM_E_INVALID_ARG, "dst too small");
    EXPECT(rm_quantize(RM_TYPE_Q4_K, x, -1, 256, q, sizeof(q), 1) == RM_E_INVALID_ARG, "negative rows");
    EXPECT(rm_quantize(RM_TYPE_Q4_K, x, INT64_MAX / 2, 256, q, sizeof(q), 1) == RM_E_INVALID_ARG, "overflow");
    EXPECT(rm_quantize(RM_TYPE_Q4_K, NULL, 1, 256, q, sizeof(q), 1) == RM_E_INVALID_ARG, "NULL src");
    EXPECT(rm_quantize(RM_TYPE_Q4_K, x, 1, 256, NULL, sizeof(q), 1) == RM_E_INVALID_ARG, "NULL dst");
    EXPECT(rm_quantize(RM_TYPE_Q4_K, x, 0, 256, q, 0, 1) == RM_OK, "zero rows");
    EXPECT(rm_last_error()[0] == '\0', "success clears the message");
    EXPECT(rm_dequantize(RM_TYPE_Q8_0, q, 67, y, 64) == RM_E_INVALID_ARG, "src too short");
    EXPECT(rm_dequantize(RM_TYPE_Q8_0, q, 68, y, 48) == RM_E_INVALID_ARG, "n not whole blocks");
    EXPECT(rm_dequantize(RM_TYPE_Q8_0, q, 68, NULL, 64) == RM_E_INVALID_ARG, "NULL dst");
    EXPECT(rm_vec_dot(RM_TYPE_Q4_K, q, 143, x, 256, &out) == RM_E_INVALID_ARG, "w too short");
    EXPECT(rm_vec_dot(RM_TYPE_Q4_K, q, 144, x, 256, NULL) == RM_E_INVALID_ARG, "NULL out");
    rm_type_info info;
    EXPECT(rm_type_describe(RM_TYPE_Q6_K, NULL) == RM_E_INVALID_ARG, "NULL info");
    EXPECT(rm_type_describe(40, &info) == RM_E_UNSUPPORTED_TYPE, "NVFP4 describe");
    EXPECT(rm_row_bytes(RM_TYPE_Q6_K, 100) == 0, "row bytes of a partial block");
    EXPECT(rm_row_bytes(99, 256) == 0, "row bytes of an unknown type");
}

int main(void) {
    enum { N_ROWS = 24, N = 4096 };  /* 98304 values: enough to start several quantize threads */
    float * x = malloc(sizeof(float) * N_ROWS * N);
    float * act = malloc(sizeof(float) * N);
    for (int i = 0; i < N_ROWS * N; ++i) x[i] = gaussian();
    for (int i = 0; i < N; ++i) act[i] = gaussian();

    int n_types = 0;
    for (int32_t type = 0; type < RM_TYPE_COUNT; ++type) {
        rm_type_info info;
        if (rm_type_describe(type, &info) != RM_OK) continue;
        ++n_types;
        test_type(type, &info, x, act, N_ROWS, N);
    }
    EXPECT(n_types == 25, "%d types implemented", n_types);
    test_errors();

    free(x);
    free(act);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
