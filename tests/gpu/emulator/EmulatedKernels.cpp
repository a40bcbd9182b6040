//===- EmulatedKernels.cpp - The CUDA backend's kernels for the emulator --===//
//
// The backend's three kernel translation units (runtime/cuda/*Kernels.cu)
// compiled by the host compiler over CudaEmulator.h, their launches queued
// on the streams of EmulatedRuntime.cpp: with the backend's host code and
// the emulated runtime, the whole CUDA backend runs on the CPU
// (sp-gpu-emulated-tests).
//
//===----------------------------------------------------------------------===//
#define SP_EMULATED_STREAMS
#include "CudaEmulator.h"

#include "runtime/cuda/AttentionKernels.cu"
#include "runtime/cuda/ElementwiseKernels.cu"
#include "runtime/cuda/RowReductionKernels.cu"
