// Status propagation macros. Debian's Abseil (20220623) predates Abseil's own
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so Tandem carries these two.
#ifndef TANDEM_COMMON_BASE_STATUS_MACROS_H_
#define TANDEM_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller when not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status tandem_status_ = (expr);           \
    if (!tandem_status_.ok()) return tandem_status_;  \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr())`: assigns the value or returns the
// error from the caller.
#define ASSIGN_OR_RETURN(lhs, expr)                                        \
  ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(tandem_statusor_, __LINE__), \
                         lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#endif  // TANDEM_COMMON_BASE_STATUS_MACROS_H_
