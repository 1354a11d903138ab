/* gpu.h - internal: a model's CUDA device (native/cuda/gpu.cu), built with RM_CUDA=ON.
 *
 * A model with a GPU owns one rm_gpu: the device, its memory budget, and the device copies of
 * the weights the placement puts there, made once at load. Every session on that model makes its
 * own CUDA backend (KV cache, scratch, streams) from it. The model code reaches both through
 * rm_device_cuda (device.h, defined in native/cuda/backend.cu). */
#ifndef RM_GPU_H
#define RM_GPU_H

#include "device.h"

typedef struct rm_gpu rm_gpu;

/* Opens device p->gpu_device and uploads the dense weights and the expert bases that
 * p->expert_on_gpu places there, within p->gpu_memory_bytes. Returns RM_OK with *out == NULL and
 * `note` set when no GPU can be used (no device, no driver): the caller falls back to the CPU.
 * Other failures (the weights do not fit the budget, a CUDA error while uploading) return their
 * status with the message set. */
rm_status rm_gpu_open(const rm_model * m, const rm_model_params * p, rm_gpu ** out, char * note, size_t note_cap);
void      rm_gpu_close(rm_gpu * g);

/* Fills the device fields of info (device, device_name, weight_bytes, used_bytes, n_experts_on_gpu). */
void      rm_gpu_describe(const rm_gpu * g, rm_gpu_info * info);

#endif
