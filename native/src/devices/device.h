/* device.h - internal: where a model runs, behind one interface.
 *
 * A device holds the model's weights where its backend reads them, made once at load, and makes
 * each session's backend (backend.h). Three implement it: the CPU (cpu/device.c: the weights the
 * kernels read faster in their own layout, repack.h), the CPU stand-in for a GPU (standin.c) and
 * CUDA (native/cuda/backend.cu over gpu.cu). model.c opens the one rm_model_params.use_gpu asks
 * for (rm_device_open) and sessions ask it for backends; nothing else in the model code knows
 * which device it runs on. To add a device: its rm_device_ops and backend, and a row in
 * device.c's table. */
#ifndef RM_DEVICE_H
#define RM_DEVICE_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rm_device_ops {
    const char * name;            /* "cpu", "standin", "cuda" */
    int32_t      kind;            /* the use_gpu value that asks for it: RM_GPU_NONE, RM_GPU_CUDA, RM_GPU_STANDIN */
    /* Places the model's weights on the device; *out is the device's state. RM_OK with
     * *out == NULL: the device cannot be used here (no GPU, no driver; `note` says why) and the
     * model runs on the CPU; the CPU's own state may be NULL (nothing to repack). Other failures
     * return their status with the message set. */
    rm_status (*open)(const rm_model * m, const rm_model_params * p, void ** out, char * note, size_t note_cap);
    /* Fills the device fields of info (device, device_name, weight_bytes, used_bytes,
     * n_experts_on_gpu); NULL: a device without them (the CPU). */
    void (*describe)(const void * dev, rm_gpu_info * info);
    void (*close)(void * dev);
    /* A backend for one session: n_batch tokens of at most max_in inputs, n_ctx positions, host
     * threads from the model's pool. NULL with the error set and its status in *st. */
    rm_backend * (*backend_new)(void * dev, const rm_model * m, int32_t n_batch, int64_t max_in, int32_t n_ctx,
                                rm_status * st);
} rm_device_ops;

extern const rm_device_ops rm_device_cpu;       /* cpu/device.c */
extern const rm_device_ops rm_device_standin;   /* standin.c */
extern const rm_device_ops rm_device_cuda;      /* cuda/backend.cu, built with RM_CUDA=ON */

/* Opens the device p->use_gpu asks for, or the CPU when that one cannot be used here (built
 * without CUDA, no GPU), with gi->note saying why; *dev and *state are then the CPU's. Sets
 * gi->active and the device fields of gi when a device other than the CPU runs the model.
 * RM_E_INVALID_ARG when use_gpu names no device. */
rm_status rm_device_open(const rm_model * m, const rm_model_params * p, const rm_device_ops ** dev, void ** state,
                         rm_gpu_info * gi);

#ifdef __cplusplus
}
#endif

#endif
