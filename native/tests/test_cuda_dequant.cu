/* test_cuda_dequant.cu - the CUDA kernels' dequantizers (rm_cu_dequant_chunk, matmul.cuh) run on
 * the host against the C reference (rm_dequantize), chunk by chunk, on random rows of every type
 * the kernels take. They are the same source the device compiles, so their indexing (the part
 * that goes wrong) is checked on a machine without a GPU. Expected: bit-identical floats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.cuh"
#include "tiny_gguf.h"

static int n_passed, n_failed;

template <int T>
static void check(const char * name, int64_t n, uint64_t * rng) {
    constexpr int C = rm_cu_chunk<T>::n;
    const int rows = 7;
    float * x = (float *) malloc(sizeof(float) * n * rows);
    for (int64_t i = 0; i < n * rows; i++) x[i] = tiny_gauss(rng) * (1.0f + (float) (i % 97) / 16.0f);
    const uint64_t rb = rm_row_bytes(T, n);
    uint8_t * q = (uint8_t *) malloc(rb * rows);
    float * ref = (float *) malloc(sizeof(float) * n);
    int bad = 0;
    if (rm_quantize(T, x, rows, n, q, rb * rows, 1) != RM_OK) {
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
                    printf("FAIL %s: row %d element %lld: %.9g, reference %.9g\n", name, r, (long long) (c * C + j),
                           got[j], ref[c * C + j]);
                    bad = 1;
                    break;
                }
            }
        }
    }
    bad ? ++n_failed : ++n_passed;
    free(x), free(q), free(ref);
}

int main(void) {
    uint64_t rng = 42;
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
    }
    printf("test_cuda_dequant: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
