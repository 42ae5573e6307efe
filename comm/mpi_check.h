// comm/mpi_check.h: MPI_CHECK, the MPI adapter of core/check.h's macro family. Every MPI call returns
// MPI_SUCCESS (0) on success; communicators must use MPI_ERRORS_RETURN for a failure to reach the check.
//   MPI_CHECK(MPI_Allreduce(...));   // throws "MPI error <code> (<text>) in `MPI_Allreduce(...)` at file:line"
#pragma once

#include <mpi.h>

#include <string>

#include "core/check.h"

namespace ringtrain::detail {

// MPI's own text for an error code.
std::string mpi_error_text(int code);

}  // namespace ringtrain::detail

#define RT_DETAIL_MPI_OK(s) ((s) == 0)
#define MPI_CHECK(call) \
  RT_CALL_CHECK_T("MPI", call, #call, RT_DETAIL_MPI_OK, ::ringtrain::detail::mpi_error_text, RT_DETAIL_NO_DEVICE)
#define MPI_CHECK_NOTHROW(call)                                                                      \
  RT_CALL_CHECK_NOTHROW_T("MPI", call, #call, RT_DETAIL_MPI_OK, ::ringtrain::detail::mpi_error_text, \
                          RT_DETAIL_NO_DEVICE)
