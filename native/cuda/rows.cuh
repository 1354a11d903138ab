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
/* The MoE sum of the split, deterministic (rm_split_device_ops.combine): out[i] += scale[s] * v_s
 * for token i's places s = i*n_slot + k in order, v_s = dev[dev_row[s]], else fix[fix_row[s]] +
 * host[host_row[s]], else host[host_row[s]] (the first row that is not -1 picks the case). */
cudaError_t rm_cu_combine(cudaStream_t st, float * out, const float * dev, const float * fix, const float * host,
                          const int32_t * dev_row, const int32_t * fix_row, const int32_t * host_row,
                          const float * scale, int32_t n_tok, int32_t n_slot, int64_t width);

#endif
