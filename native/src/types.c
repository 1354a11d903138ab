/* types.c - the type-traits table (placeholder until the quant kernels land). */
#include "status.h"

rm_status rm_type_describe(int32_t type, rm_type_info * out) { return rm_fail(RM_E_INTERNAL, "not built"); }
uint64_t rm_row_bytes(int32_t type, int64_t n) { return 0; }
rm_status rm_quantize(int32_t type, const float * src, int64_t n_rows, int64_t n_per_row, void * dst, uint64_t dst_cap, int32_t n_threads) { return rm_fail(RM_E_INTERNAL, "not built"); }
rm_status rm_dequantize(int32_t type, const void * src, uint64_t src_len, float * dst, int64_t n) { return rm_fail(RM_E_INTERNAL, "not built"); }
rm_status rm_vec_dot(int32_t type, const void * w, uint64_t w_len, const float * x, int64_t n, float * out) { return rm_fail(RM_E_INTERNAL, "not built"); }
