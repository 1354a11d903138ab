/* norm.cuh - RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, row by row. */
#ifndef RM_CUDA_NORM_CUH
#define RM_CUDA_NORM_CUH

#include "common.cuh"

/* n_rows rows of n floats (y may be x); w: n floats. */
cudaError_t rm_cu_rmsnorm(cudaStream_t st, float * y, const float * x, const float * w, int64_t n_rows, int64_t n,
                          float eps);

#endif
