/* Readable names for the device kernels CUPTI reports (engine/cuda/timer_cupti.c). */
#ifndef GPTC_KERNEL_NAME_H
#define GPTC_KERNEL_NAME_H

#include <stddef.h>

/* out[n] = the name of the kernel whose symbol is `symbol`, as a report names it: an
 * Itanium-mangled C++ symbol (_Z...) becomes its qualified function name, with the
 * template arguments that are plain types or integers and without parameter types
 * ("_ZN8cublasLt8epilogue4impl12globalKernelILi8EEvv" ->
 * "cublasLt::epilogue::impl::globalKernel<8>"; builtin types spelled without spaces,
 * "unsigned_long"); any other symbol (a C name, as cuBLAS's sm90_xmma_* kernels have)
 * stays as it is. Characters that would need quoting in the
 * report's JSON or its whitespace-separated gather (spaces, quotes, backslashes, control
 * characters) become '_'; the name is cut to n - 1 bytes. NULL or "" gives "?". */
void kernel_name(const char *symbol, char *out, size_t n);

#endif
