// What a path is before it is read, and what a writer left behind: one place
// for both, so every reader refuses the same things the same way.
#pragma once
#include <sys/stat.h>

#include <string>
#include <vector>

namespace pooch::file_check {

// "a directory", "a FIFO (named pipe)", "a character device", ... for messages.
const char* file_kind(mode_t mode);

// Opens `path` for reading without blocking (open() of a FIFO with no
// writer would wait for ever) and returns the descriptor (the caller closes
// it) with *st filled in. Anything but a regular file is refused with
// Error(POOCH_ERR_IO) naming the path and what it is, and so is a regular
// file whose size the system does not report (/proc and /sys files say 0
// bytes but have content), since every read is bounded by the size
// announced. `what` says what the path should name ("a data file").
int open_regular(const std::string& path, const char* what, struct stat* st);

// Removes the temporary files `<path>.tmp-<pid>-<n>` that an atomic writer
// killed mid-write left beside `path`, where process <pid> no longer exists;
// returns the names removed. Another live writer's files are left alone.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// Where the formats layer sends a one-line note (the C API routes it to the
// library's log; nullptr: nowhere).
using NoteFn = void (*)(const char* line);
void set_note_sink(NoteFn fn);
void note(const std::string& line);

}  // namespace pooch::file_check
