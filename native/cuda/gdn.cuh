/* gdn.cuh - the middle of a Gated DeltaNet layer (backend.h's gdn): gates, the causal conv over
 * each sequence's conv state, unit q and k, the gated delta rule over each sequence's states in
 * the chunked form's layout (rm_gdn_state_floats: a state moves between backends as it is), and
 * the gated norm; and the gated attention's two small ops. */
#ifndef RM_CUDA_GDN_CUH
#define RM_CUDA_GDN_CUH

#include "common.cuh"

/* The largest d_conv, and d_v (a block's columns), the kernels take. */
#define RM_CU_GDN_MAX_CONV 8
#define RM_CU_GDN_MAX_DV   1024

/* a as rm_gdn_args says, with the weights' device copies: filters (conv_dim rows of d_conv, of
 * filter_type F32 or F16, row_bytes apart), A and dt (n_v floats), norm (d_v floats); seqs_dev:
 * the n_seqs sequences in device memory. */
cudaError_t rm_cu_gdn(cudaStream_t st, const rm_gdn_args * a, const rm_gdn_seq * seqs_dev, const uint8_t * filters,
                      int32_t filter_type, uint64_t filter_row_bytes, const float * A, const float * dt,
                      const float * norm);

/* dst row r = src row r (width floats), n_rows rows */
cudaError_t rm_cu_copy_rows(cudaStream_t st, float * dst, int64_t dst_stride, const float * src, int64_t src_stride,
                            int64_t width, int64_t n_rows);

/* y[i] /= 1 + exp(-gate[i]) */
/* y[i] /= 1 + exp(-gate[i / width]), i < n * width */
cudaError_t rm_cu_mul_sigmoid(cudaStream_t st, float * y, const float * gate, int64_t n, int64_t width);

#endif
