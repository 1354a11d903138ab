/* rows.cuh - moving rows between token order and expert order: gathering the rows an expert
 * needs, and summing the experts' outputs back into each token's row. */
#ifndef RM_CUDA_ROWS_CUH
#define RM_CUDA_ROWS_CUH

#include "common.cuh"

/* dst[j] = src[rows[j]] for j < n; rows in device memory. */
cudaError_t rm_cu_gather_rows(cudaStream_t st, float * dst, const float * src, const int32_t * rows, int32_t n,
                              int64_t width);
/* dst[rows[j]] += scale[j] * src[j] for j < n; rows may repeat (atomic adds). */
cudaError_t rm_cu_scatter_add(cudaStream_t st, float * dst, const float * src, const int32_t * rows,
                              const float * scale, int32_t n, int64_t width);
/* The MoE sum, deterministic: out[i] += sum over k < n_slot of scale[i*n_slot + k] *
 * src[row[i*n_slot + k]], skipping row -1; each token's slots are added in order. */
cudaError_t rm_cu_combine(cudaStream_t st, float * out, const float * src, const int32_t * row, const float * scale,
                          int32_t n_tok, int32_t n_slot, int64_t width);

#endif
