/* cpu/float_ref.c - the plain twins of the float kernels of dispatch.h: axpy and attention's two
 * halves. Every kernel set falls back to them (dispatch.c), and the SIMD sets call them for row
 * lengths their vectors do not divide (simd_x86.h): a unit of their own, below both. */
#include "dispatch.h"

#include <math.h>

void rm_cpu_axpy_ref(int64_t n, float a, const float * x, float * y) {
    for (int64_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

void rm_cpu_attn_scores_ref(int64_t d, int64_t n, const float * q, const float * k, int64_t stride, float scale,
                            float * s) {
    for (int64_t p = 0; p < n; p++) {
        float sum = 0.0f;
        for (int64_t i = 0; i < d; i++) {
            sum += q[i] * k[p * stride + i];
        }
        s[p] = scale * sum;
    }
}

void rm_cpu_attn_values_ref(int64_t d, int64_t n, const float * s, const float * v, int64_t stride, float * out,
                            int accumulate) {
    for (int64_t i = 0; i < d && !accumulate; i++) {
        out[i] = 0.0f;
    }
    for (int64_t p = 0; p < n; p++) {
        rm_cpu_axpy_ref(d, s[p], v + p * stride, out);
    }
}

void rm_cpu_attn_scores_rows_ref(int64_t d, int64_t n, int nr, const float * const q[], const float * k, int64_t stride,
                                 float scale, float * s, int64_t s_stride) {
    for (int r = 0; r < nr; r++) {
        rm_cpu_attn_scores_ref(d, n, q[r], k, stride, scale, s + r * s_stride);
    }
}

void rm_cpu_attn_values_rows_ref(int64_t d, int64_t n, int nr, const float * s, int64_t s_stride, const float * v,
                                 int64_t stride, float * const out[]) {
    for (int r = 0; r < nr; r++) {
        rm_cpu_attn_values_ref(d, n, s + r * s_stride, v, stride, out[r], 1);
    }
}

float rm_cpu_max_ref(const float * x, int64_t n, float m) {
    for (int64_t j = 0; j < n; j++) {
        m = x[j] > m ? x[j] : m;
    }
    return m;
}

float rm_cpu_exp_sum_ref(float * x, int64_t n, float m) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - m);
        sum += x[j];
    }
    return sum;
}
