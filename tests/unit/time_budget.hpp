// Wall-time bounds that tell "finished" from "hung" (a parser that loops, an open that
// blocks). They are not performance targets: sanitizer builds run several times slower
// and CI runs the suite in parallel on two cores, so there the bound is ten times looser.
// A real hang still fails it.
#pragma once

namespace kreg::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr double kTimeScale = 10;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr double kTimeScale = 10;
#else
inline constexpr double kTimeScale = 1;
#endif
#else
inline constexpr double kTimeScale = 1;
#endif

// `seconds` scaled for this build.
constexpr double budget(double seconds) { return seconds * kTimeScale; }

}  // namespace kreg::test
