// cuDNN 9, loaded at run time on first use, as cuBLAS and cuSPARSE are
// (cuda_libs.h): libpooch has no load-time dependency on it, and a machine
// without it runs everything but the convolutional kernels, whose
// `supports` then answers no (the planner names the op it has no kernel
// for). cuDNN 9's libcudnn.so.9 is a shim that exports the whole API and
// loads its sub-libraries (ops, cnn, engines) itself.
//
// Host code only; includes cudnn.h.
#pragma once
#include <cudnn.h>

#include <string>

#define POOCH_CUDNN_FUNCTIONS(X)                    \
  X(cudnnCreate)                                    \
  X(cudnnSetStream)                                 \
  X(cudnnGetErrorString)                            \
  X(cudnnCreateTensorDescriptor)                    \
  X(cudnnSetTensor4dDescriptor)                     \
  X(cudnnCreateFilterDescriptor)                    \
  X(cudnnSetFilter4dDescriptor)                     \
  X(cudnnCreateConvolutionDescriptor)               \
  X(cudnnSetConvolution2dDescriptor)                \
  X(cudnnSetConvolutionGroupCount)                  \
  X(cudnnSetConvolutionMathType)                    \
  X(cudnnGetConvolutionForwardAlgorithm_v7)         \
  X(cudnnGetConvolutionForwardWorkspaceSize)        \
  X(cudnnConvolutionForward)                        \
  X(cudnnAddTensor)                                 \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)    \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)   \
  X(cudnnConvolutionBackwardData)                   \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)  \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) \
  X(cudnnConvolutionBackwardFilter)                 \
  X(cudnnConvolutionBackwardBias)                   \
  X(cudnnDeriveBNTensorDescriptor)                  \
  X(cudnnBatchNormalizationForwardTraining)         \
  X(cudnnBatchNormalizationForwardInference)        \
  X(cudnnBatchNormalizationBackward)                \
  X(cudnnCreatePoolingDescriptor)                   \
  X(cudnnSetPooling2dDescriptor)                    \
  X(cudnnPoolingForward)                            \
  X(cudnnPoolingBackward)

namespace pooch::kern::cuda {

struct CudnnLib {
#define POOCH_CUDNN_MEMBER(name) decltype(&::name) name = nullptr;
  POOCH_CUDNN_FUNCTIONS(POOCH_CUDNN_MEMBER)
#undef POOCH_CUDNN_MEMBER
};

// "libcudnn.so.9" for the cuDNN 9 headers this build was compiled with.
const char* cudnn_soname();

// Loads cuDNN once per process (thread-safe; later calls return the first
// answer). False, with *why naming the library, when it or a function is
// missing. Never throws.
bool load_cudnn(std::string* why);

// The table load_cudnn filled (null members before it succeeded).
const CudnnLib& cudnn();

}  // namespace pooch::kern::cuda
