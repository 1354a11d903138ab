/* rows.cu - see rows.cuh. */
#include "rows.cuh"

__global__ void k_gather_rows(float * dst, const float * src, const int32_t * rows, int32_t n, int64_t width) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t) n * width;
         i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t j = i / width, c = i % width;
        dst[i] = src[(int64_t) rows[j] * width + c];
    }
}

__global__ void k_scatter_add(float * dst, const float * src, const int32_t * rows, const float * scale, int32_t n,
                              int64_t width) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t) n * width;
         i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t j = i / width, c = i % width;
        atomicAdd(dst + (int64_t) rows[j] * width + c, scale[j] * src[i]);
    }
}

__global__ void k_combine(float * out, const float * src, const int32_t * row, const float * scale, int32_t n_tok,
                          int32_t n_slot, int64_t width) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t) n_tok * width;
         i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t t = i / width, c = i % width;
        float acc = out[i];
        for (int32_t k = 0; k < n_slot; k++) {
            const int32_t r = row[t * n_slot + k];
            if (r >= 0) {
                acc += scale[t * n_slot + k] * src[(int64_t) r * width + c];
            }
        }
        out[i] = acc;
    }
}

static unsigned grid_for(int64_t n) {
    const unsigned b = rm_cu_blocks(n, 256);
    return b < 65535u ? (b ? b : 1u) : 65535u;
}

cudaError_t rm_cu_gather_rows(cudaStream_t st, float * dst, const float * src, const int32_t * rows, int32_t n,
                              int64_t width) {
    if ((int64_t) n * width <= 0) return cudaSuccess;
    k_gather_rows<<<grid_for((int64_t) n * width), 256, 0, st>>>(dst, src, rows, n, width);
    return cudaGetLastError();
}

cudaError_t rm_cu_scatter_add(cudaStream_t st, float * dst, const float * src, const int32_t * rows,
                              const float * scale, int32_t n, int64_t width) {
    if ((int64_t) n * width <= 0) return cudaSuccess;
    k_scatter_add<<<grid_for((int64_t) n * width), 256, 0, st>>>(dst, src, rows, scale, n, width);
    return cudaGetLastError();
}

cudaError_t rm_cu_combine(cudaStream_t st, float * out, const float * src, const int32_t * row, const float * scale,
                          int32_t n_tok, int32_t n_slot, int64_t width) {
    if ((int64_t) n_tok * width <= 0) return cudaSuccess;
    k_combine<<<grid_for((int64_t) n_tok * width), 256, 0, st>>>(out, src, row, scale, n_tok, n_slot, width);
    return cudaGetLastError();
}
