/* norm.cu - RMSNorm, one block per row (see norm.cuh). */
#include "norm.cuh"

#define RM_NORM_THREADS 256

__global__ void k_rmsnorm(float * y, const float * x, const float * w, int64_t n, float eps) {
    __shared__ float partial[RM_NORM_THREADS / RM_WARP];
    const float * xr = x + (int64_t) blockIdx.x * n;
    float * yr = y + (int64_t) blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        ss += xr[i] * xr[i];
    }
    ss = rm_cu_warp_sum(ss);
    if (threadIdx.x % RM_WARP == 0) {
        partial[threadIdx.x / RM_WARP] = ss;
    }
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < RM_NORM_THREADS / RM_WARP; i++) {
        total += partial[i];
    }
    const float scale = rsqrtf(total / (float) n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
    }
}

cudaError_t rm_cu_rmsnorm(cudaStream_t st, float * y, const float * x, const float * w, int64_t n_rows, int64_t n,
                          float eps) {
    if (n_rows <= 0) {
        return cudaSuccess;
    }
    k_rmsnorm<<<(unsigned) n_rows, RM_NORM_THREADS, 0, st>>>(y, x, w, n, eps);
    return cudaGetLastError();
}
