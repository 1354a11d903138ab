/* add.cuh - additions into the residual stream and its kin. */
#ifndef RM_CUDA_ADD_CUH
#define RM_CUDA_ADD_CUH

#include "common.cuh"

/* y += x over n floats */
cudaError_t rm_cu_add(cudaStream_t st, float * y, const float * x, int64_t n);
/* y[i] += b over n_rows rows of n */
cudaError_t rm_cu_add_bias(cudaStream_t st, float * y, const float * b, int64_t n_rows, int64_t n);
/* y[i] += sigmoid(gate[i]) * x[i] over n_rows rows of n (the shared expert's gate) */
cudaError_t rm_cu_add_gated(cudaStream_t st, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n);

struct rm_split_group;
/* y[g.row0 + j] += row g.mat of b (n floats a row) for each row j < g.n of each of the n_groups
 * groups in device memory (max_rows the most rows of one): gpt-oss's expert biases in the split */
cudaError_t rm_cu_add_expert_bias(cudaStream_t st, float * y, int64_t y_stride, const float * b, int64_t n,
                                  const struct rm_split_group * groups, int32_t n_groups, int32_t max_rows);

#endif
