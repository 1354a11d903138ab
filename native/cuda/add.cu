/* add.cu - grid-stride elementwise additions (see add.cuh). */
#include "add.cuh"

#include "matmul.cuh"

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

/* group blockIdx.y's rows */
__global__ void k_add_expert_bias(float * y, int64_t ys, const float * b, int64_t n, const rm_cu_group * groups) {
    const rm_cu_group g = groups[blockIdx.y];
    const int64_t total = (int64_t) g.n * n;
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t j = i / n, k = i % n;
        y[(g.row0 + j) * ys + k] += b[(int64_t) g.mat * n + k];
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

cudaError_t rm_cu_add_expert_bias(cudaStream_t st, float * y, int64_t y_stride, const float * b, int64_t n,
                                  const struct rm_split_group * groups, int32_t n_groups, int32_t max_rows) {
    if (n_groups <= 0 || max_rows <= 0 || n <= 0) return cudaSuccess;
    if (n_groups > 65535) return cudaErrorInvalidConfiguration;
    const dim3 grid(grid_for((int64_t) max_rows * n), (unsigned) n_groups);
    k_add_expert_bias<<<grid, 256, 0, st>>>(y, y_stride, b, n, groups);
    return cudaGetLastError();
}

cudaError_t rm_cu_add_gated(cudaStream_t st, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    if (n_rows * n <= 0) return cudaSuccess;
    k_add_gated<<<grid_for(n_rows * n), 256, 0, st>>>(y, x, gate, n_rows, n);
    return cudaGetLastError();
}
