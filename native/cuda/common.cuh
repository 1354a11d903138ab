/* common.cuh - what every CUDA file shares: the C headers, 16-bit floats on both sides, warp
 * reductions, and the launch geometry helpers.
 *
 * Kernels never abort: a launcher returns the cudaError_t of its launch (cudaGetLastError), and
 * the backend turns the first error into RM_E_CUDA with a message (backend.cu). */
#ifndef RM_CUDA_COMMON_CUH
#define RM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* The C headers pin their block layouts with C11's _Static_assert; C++ spells it static_assert. */
#ifndef _Static_assert
#define _Static_assert static_assert
#endif

extern "C" {
#include "backend.h"
#include "status.h"
#include "types.h"
}

#define RM_WARP 32

/* binary16 bits to float: the hardware conversion on the device, the C reference on the host
 * (so the dequantizers below can be checked on a machine without a GPU). */
__host__ __device__ static inline float rm_cu_half(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return rm_fp16_to_fp32(h);
#endif
}

#ifdef __CUDACC__
__device__ static inline float rm_cu_warp_sum(float v) {
    for (int o = RM_WARP / 2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ static inline float rm_cu_warp_max(float v) {
    for (int o = RM_WARP / 2; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}
#endif

static inline unsigned rm_cu_blocks(int64_t n, int threads) {
    return (unsigned) ((n + threads - 1) / threads);
}

#endif
