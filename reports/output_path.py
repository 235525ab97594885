"""Output paths of the Python commands (reports/*.py, repro/run.py, the PyTorch peers' result files): never one of
the command's inputs, never anything but a regular file, written atomically.

check_file(out, inputs)    raises OutputPathError when `out` is empty, is one of `inputs` (the same path, a symbolic
                           link to it or a hard link: os.path.samefile, i.e. st_dev and st_ino), exists and is not a
                           regular file (a folder, a device such as /dev/null, a fifo, a socket) or is a symbolic
                           link whose target does not exist (results/output_path.cpp refuses it too)
check_folder(out, inputs)  the same for a folder that receives files: it may exist only as a folder
atomic(out, inputs)        context manager: check_file and that the folder of `out` exists, then yields a temporary
                           path in that folder (its link target's folder when `out` is a symbolic link, so that the
                           link stays) to write;
                           on success the file is synced and renamed over the target (os.replace), on failure
                           removed, so `out` is either the old file or the whole new one
write_text(out, text, inputs)   atomic() for a UTF-8 text file

Standard library only.
"""

import contextlib
import os
import stat


class OutputPathError(ValueError):
    """An output path that would destroy an input or replace something that is not a regular file."""


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _same_input(out, inputs):
    """The first of `inputs` that is the same file (or folder) as `out`, or None."""
    for i in inputs:
        try:
            if os.path.samefile(out, i):
                return i
        except OSError:  # one of them does not exist: not the same file
            continue
    return None


def check_file(out, inputs=()):
    """Raises OutputPathError unless the file `out` can be written without harm: it is not empty, none of `inputs`
    (paths read by the same command), where it exists a regular file (symbolic links followed), and not a symbolic
    link to nothing."""
    same = _same_input(out, inputs)
    if same is not None:
        shown = f"'{same}'" if same == out else f"'{same}' (the same file through a link)"
        raise OutputPathError(f"'{out}' is the input {shown}: writing it would destroy the input; name another "
                              f"output path")
    if out == "":
        raise OutputPathError("the output path is empty, expected the path of the file to write")
    try:
        mode = os.stat(out).st_mode
    except OSError as e:
        if os.path.islink(out):  # a dangling link: writing through it would create its target somewhere else
            raise OutputPathError(f"'{out}' is a symbolic link to '{os.readlink(out)}', which does not exist "
                                  f"({e.strerror}); expected a link to an existing regular file, a regular file, "
                                  f"or a path that does not exist yet") from None
        return  # absent, or its folder is not one: nothing there to destroy (writing it fails plainly)
    if not stat.S_ISREG(mode):
        raise OutputPathError(f"'{out}' is {_kind(mode)}, expected the path of a regular file to write")


def check_folder(out, inputs=()):
    """Raises OutputPathError unless `out` is a folder or absent, and none of `inputs`."""
    same = _same_input(out, inputs)
    if same is not None:
        raise OutputPathError(f"'{out}' is the input '{same}', expected a folder for the output files")
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputPathError(f"'{out}' exists and is not a folder, expected a folder for the output files")


@contextlib.contextmanager
def atomic(out, inputs=()):
    """Yields a temporary path beside `out` (beside its target when `out` is a symbolic link) after check_file;
    renames it over the target when the block ends normally and the temporary file exists, removes it otherwise.
    Raises OutputPathError (nothing written: also when the folder of `out` does not exist) or what the block or the
    rename raise (nothing replaced)."""
    check_file(out, inputs)
    target = os.path.realpath(out)
    folder, name = os.path.split(target)
    if not os.path.isdir(folder):
        raise OutputPathError(f"the folder of '{out}' does not exist, expected an existing folder for the output file")
    root, ext = os.path.splitext(name)
    tmp = os.path.join(folder, f".{root}.tmp-{os.getpid()}{ext}")  # keeps the extension (matplotlib's format)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        check_file(out, inputs)  # nothing took its place while the block ran
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def write_text(out, text, inputs=()):
    """Writes `text` (UTF-8) to `out` through atomic(); raises OutputPathError or OSError."""
    with atomic(out, inputs) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
