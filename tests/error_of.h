// error_of(f): the message of the exception that f throws, or "no error" when it returns normally; for
// tests that check what an error says.
#pragma once
#include <exception>
#include <functional>
#include <string>

namespace gpt {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace gpt
