/* swiglu.cu - see swiglu.cuh. */
#include "swiglu.cuh"

__global__ void k_swiglu(float * g, const float * u, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

/* rm_swiglu_clamp_ref: gpt-oss's form (alpha > 0), the limited SwiGLU (alpha 0) or DeepSeek-V4's (alpha < 0) */
__global__ void k_swiglu_clamp(float * g, const float * u, int64_t n, float alpha, float limit) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const float y = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        if (alpha == 0.0f) {
            const float s = g[i] / (1.0f + expf(-g[i]));
            g[i] = (s < limit ? s : limit) * y;
        } else if (alpha < 0.0f) {   /* DeepSeek-V4's */
            const float x = g[i] < limit ? g[i] : limit;
            g[i] = x / (1.0f + expf(-x)) * y;
        } else {
            const float x = g[i] < limit ? g[i] : limit;
            g[i] = x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
        }
    }
}

cudaError_t rm_cu_swiglu_clamp(cudaStream_t st, float * g, const float * u, int64_t n, float alpha, float limit) {
    if (n <= 0) return cudaSuccess;
    unsigned b = rm_cu_blocks(n, 256);
    k_swiglu_clamp<<<b < 65535u ? b : 65535u, 256, 0, st>>>(g, u, n, alpha, limit);
    return cudaGetLastError();
}

cudaError_t rm_cu_swiglu(cudaStream_t st, float * g, const float * u, int64_t n) {
    if (n <= 0) return cudaSuccess;
    unsigned b = rm_cu_blocks(n, 256);
    k_swiglu<<<b < 65535u ? b : 65535u, 256, 0, st>>>(g, u, n);
    return cudaGetLastError();
}

__global__ void k_geglu(float * g, int64_t gs, const float * u, int64_t us, int64_t width, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t r = i / width, j = i % width;
        const float x = g[r * gs + j];
        g[r * gs + j] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[r * us + j];
    }
}

cudaError_t rm_cu_geglu(cudaStream_t st, float * g, int64_t g_stride, const float * u, int64_t u_stride, int64_t width,
                        int64_t n_rows) {
    const int64_t n = width * n_rows;
    if (n <= 0) return cudaSuccess;
    unsigned b = rm_cu_blocks(n, 256);
    k_geglu<<<b < 65535u ? b : 65535u, 256, 0, st>>>(g, g_stride, u, u_stride, width, n);
    return cudaGetLastError();
}

__global__ void k_scale(float * x, int64_t n, float f) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        x[i] *= f;
    }
}

cudaError_t rm_cu_scale(cudaStream_t st, float * x, int64_t n, float f) {
    if (n <= 0) return cudaSuccess;
    unsigned b = rm_cu_blocks(n, 256);
    k_scale<<<b < 65535u ? b : 65535u, 256, 0, st>>>(x, n, f);
    return cudaGetLastError();
}
