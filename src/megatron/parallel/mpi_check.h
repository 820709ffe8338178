#pragma once
// Error checking for every MPI call. Communicators are set to MPI_ERRORS_RETURN (launch.h), so
// a failure comes back as a code; MPI_CHECK turns it into megatron::Error naming the call, MPI's
// error string, the world rank and the group.
#include <mpi.h>

#include <string>

namespace megatron {

[[noreturn]] void mpi_fail(const char* call, int code, const std::string& group, const char* file, int line);

// World rank of this process, or -1 before MPI_Init / after MPI_Finalize.
int mpi_world_rank();

}  // namespace megatron

#define MPI_CHECK(call, group)                                                        \
  do {                                                                                \
    const int megatron_mpi_status_ = (call);                                          \
    if (megatron_mpi_status_ != MPI_SUCCESS)                                          \
      ::megatron::mpi_fail(#call, megatron_mpi_status_, (group), __FILE__, __LINE__); \
  } while (0)
