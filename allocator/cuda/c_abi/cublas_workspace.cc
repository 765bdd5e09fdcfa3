// headroom_cublas_set_workspace: the one C function that calls a CUDA
// library, kept apart so that headroom_alloc.cc runs without a GPU.
#include <cublas_v2.h>

#include "absl/strings/str_format.h"
#include "allocator/cuda/c_abi/c_abi_internal.h"
#include "allocator/cuda/c_abi/headroom_alloc.h"

extern "C" {

int headroom_cublas_set_workspace(void* cublas_handle, size_t bytes, int device, cudaStream_t stream,
                                  void** workspace) {
  using headroom::c_abi::Fail;
  if (cublas_handle == nullptr || workspace == nullptr || bytes == 0) {
    return Fail(absl::InvalidArgumentError("headroom_cublas_set_workspace: null handle/workspace or 0 bytes"));
  }
  void* ptr = headroom_malloc(static_cast<ssize_t>(bytes), device, stream);
  if (ptr == nullptr) return -1;
  const cublasStatus_t status = cublasSetWorkspace(static_cast<cublasHandle_t>(cublas_handle), ptr, bytes);
  if (status != CUBLAS_STATUS_SUCCESS) {
    headroom_free(ptr, static_cast<ssize_t>(bytes), device, stream);
    return Fail(absl::InternalError(absl::StrFormat("cublasSetWorkspace: %s", cublasGetStatusString(status))));
  }
  *workspace = ptr;
  return 0;
}

}  // extern "C"
