// Confining the paths a server opens on a client's word (weight updates) to directories it was
// told to trust.
//
// Why: an admin route that loads weights from any path makes the engine read any file it can (and
// its errors describe it). Paths are resolved first (symlinks followed, ".." removed), so neither
// a symlink inside a trusted directory nor ".." escapes it.
#pragma once

#include <string>
#include <vector>

#include "miles/status.h"

namespace miles {

// Ok when `path`, resolved, lies inside one of `trusted` (resolved likewise); empty `trusted`
// confines nothing. The error names the path and `flag`, never anything read from the file.
Status confine_path(const std::string& path, const std::vector<std::string>& trusted,
                    const std::string& flag);

}  // namespace miles
