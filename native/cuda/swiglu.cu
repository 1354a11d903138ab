/* swiglu.cu - see swiglu.cuh. */
#include "swiglu.cuh"

__global__ void k_swiglu(float * g, const float * u, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

__global__ void k_swiglu_clamp(float * g, const float * u, int64_t n, float alpha, float limit) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const float x = g[i] < limit ? g[i] : limit;
        const float y = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        g[i] = x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
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
