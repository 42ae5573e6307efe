// comm/mpi_check.cpp: MPI's error texts for MPI_CHECK.
#include "comm/mpi_check.h"

namespace ringtrain::detail {

std::string mpi_error_text(int code) {
  char buffer[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, buffer, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buffer, static_cast<size_t>(length));
}

}  // namespace ringtrain::detail
