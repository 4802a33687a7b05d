//! IO through the binary: piping, truncated files, corrupt lines, append after SIGKILL.
