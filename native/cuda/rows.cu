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

__global__ void k_combine(float * out, const float * dev, const float * fix, const float * host,
                          const int32_t * dev_row, const int32_t * fix_row, const int32_t * host_row,
                          const float * scale, int32_t n_tok, int32_t n_slot, int64_t width) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t) n_tok * width;
         i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t t = i / width, c = i % width;
        float acc = out[i];
        for (int32_t k = 0; k < n_slot; k++) {
            const int64_t s = t * n_slot + k;
            float v;
            if (dev_row[s] >= 0) {
                v = dev[(int64_t) dev_row[s] * width + c];
            } else if (fix_row[s] >= 0) {
                v = fix[(int64_t) fix_row[s] * width + c] + host[(int64_t) host_row[s] * width + c];
            } else if (host_row[s] >= 0) {
                v = host[(int64_t) host_row[s] * width + c];
            } else {
                continue;
            }
            acc += scale[s] * v;
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

cudaError_t rm_cu_combine(cudaStream_t st, float * out, const float * dev, const float * fix, const float * host,
                          const int32_t * dev_row, const int32_t * fix_row, const int32_t * host_row,
                          const float * scale, int32_t n_tok, int32_t n_slot, int64_t width) {
    if ((int64_t) n_tok * width <= 0) return cudaSuccess;
    k_combine<<<grid_for((int64_t) n_tok * width), 256, 0, st>>>(out, dev, fix, host, dev_row, fix_row, host_row,
                                                                 scale, n_tok, n_slot, width);
    return cudaGetLastError();
}
