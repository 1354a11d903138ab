/* add.cu - grid-stride elementwise additions (see add.cuh). */
#include "add.cuh"

__global__ void k_add(float * y, const float * x, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        y[i] += x[i];
    }
}

__global__ void k_add_bias(float * y, const float * b, int64_t n_rows, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * n; i += (int64_t) gridDim.x * blockDim.x) {
        y[i] += b[i % n];
    }
}

__global__ void k_add_gated(float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * n; i += (int64_t) gridDim.x * blockDim.x) {
        const float g = 1.0f / (1.0f + expf(-gate[i / n]));
        y[i] += g * x[i];
    }
}

static unsigned grid_for(int64_t n) {
    const unsigned b = rm_cu_blocks(n, 256);
    return b < 65535u ? (b ? b : 1u) : 65535u;
}

cudaError_t rm_cu_add(cudaStream_t st, float * y, const float * x, int64_t n) {
    if (n <= 0) return cudaSuccess;
    k_add<<<grid_for(n), 256, 0, st>>>(y, x, n);
    return cudaGetLastError();
}

cudaError_t rm_cu_add_bias(cudaStream_t st, float * y, const float * b, int64_t n_rows, int64_t n) {
    if (n_rows * n <= 0) return cudaSuccess;
    k_add_bias<<<grid_for(n_rows * n), 256, 0, st>>>(y, b, n_rows, n);
    return cudaGetLastError();
}

cudaError_t rm_cu_add_gated(cudaStream_t st, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    if (n_rows * n <= 0) return cudaSuccess;
    k_add_gated<<<grid_for(n_rows * n), 256, 0, st>>>(y, x, gate, n_rows, n);
    return cudaGetLastError();
}
