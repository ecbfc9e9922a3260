#pragma once
/** @file Error types shared by every layer of mpar. */
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpar {

/** @brief Raised when user input (sizes, options, mesh shapes) is invalid; the message says what to change. */
class config_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/**
 * @brief Mixed into an exception that only reports other ranks' failures ("load_checkpoint failed on
 * rank(s) 1 of group 'world'; see their errors"). A run that collects every rank's error (run_threads)
 * puts the failing ranks' own errors first and such a report after them, whichever rank threw first.
 */
class peer_failure_report {
 public:
  virtual ~peer_failure_report() = default;
};

namespace detail {
/** Builds a message from streamable parts, so call sites stay one line long. */
template <class... Parts>
[[nodiscard]] std::string cat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

/** The message of a captured exception, for reporting it elsewhere (another thread, the next wait). */
[[nodiscard]] inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}
}  // namespace detail

/** @brief Throws config_error with the concatenated message unless `ok`. */
template <class... Parts>
constexpr void require(bool ok, Parts&&... parts) {
  if (!ok) throw config_error(detail::cat(std::forward<Parts>(parts)...));
}

}  // namespace mpar
