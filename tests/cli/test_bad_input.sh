#!/usr/bin/env bash
# Bad input and hostile output paths (issue 12): nanomind never damages a file
# or node it did not create, never hangs on a FIFO, and says what went wrong
# with a non-zero exit. docs/correctness.md ("Bad input") lists every case.
# usage: test_bad_input.sh path/to/nanomind ; prints "N passed, N failed, N skipped".
# The helpers (nm, expect, setup) are tests/cli/lib.sh.
set -u
NM=$1
NM_TIMEOUT=30 # every case here must end at once; a hang is a failure, not a wait
. "$(dirname "$0")/lib.sh"

# What a path is now, to compare before and after: type, mode, size, content hash.
state() {
    if [ -L "$1" ]; then echo "link -> $(readlink "$1")"
    elif [ -e "$1" ]; then stat -c '%F %a %s %t:%T' "$1" | tr '\n' ' '; [ -f "$1" ] && sha256sum < "$1" | cut -c1-16
    else echo absent; fi
}
# The temporaries a writer may leave in a folder (there must be none).
leftovers() { find "$1" -maxdepth 1 -name '.*.nm-*.tmp' | wc -l; }

# ---- data loss: say -o at things it did not create ------------------------------
case_say_device_node() {
    local node=$tmp/full7
    rm -f "$node"
    mknod "$node" c 1 7 2>/dev/null || ln -s /dev/full "$node" # not root: /dev/full itself, through a link
    local before out; before=$(state "$node")
    out=$(nm say hello -o "$node" 2>&1)
    echo "$out | node: $([ "$(state "$node")" = "$before" ] && echo kept || echo CHANGED)" | tr '\n' ' '; echo
}
expect say_to_full_device_keeps_the_node 1 "cannot write .*full7.*No space left on device \\| node: kept $" -- case_say_device_node

case_say_existing_file_write_fails() {
    local d=$tmp/efbig; mkdir -p "$d"; printf 'keep me\n' > "$d/a.wav"; chmod 640 "$d/a.wav"
    local before; before=$(state "$d/a.wav")
    # A file-size limit (1 MiB, above the TABM ring's shared memory) makes the
    # writes past it fail (EFBIG), as a full disk would: 48 kHz s16 is 96 KB/s.
    local out text="This sentence is spoken again and again, long enough to fill more than one mebibyte of audio."
    out=$( (trap '' XFSZ; ulimit -f 1024; nm say "$text $text $text $text $text $text" --sample-rate 48000 -o "$d/a.wav") 2>&1)
    echo "$out | file: $([ "$(state "$d/a.wav")" = "$before" ] && echo kept || echo CHANGED), leftovers: $(leftovers "$d")" | tr '\n' ' '; echo
}
expect say_failed_write_keeps_the_old_file 1 "File too large \\| file: kept, leftovers: 0 $" -- case_say_existing_file_write_fails

case_say_read_only_folder() {
    local d=$tmp/ro; mkdir -p "$d"; printf 'old\n' > "$d/a.wav"; chmod 644 "$d/a.wav"; chmod 555 "$d"; chmod 755 "$tmp"
    local before out rc; before=$(state "$d/a.wav")
    if [ "$(id -u)" = 0 ]; then # root writes anywhere: run as nobody
        out=$(HOME=$tmp timeout "$NM_TIMEOUT" setpriv --reuid=65534 --regid=65534 --clear-groups "$NM" say hi -o "$d/a.wav" 2>&1)
        rc=$?
        echo "$rc" >> "$tmp/rc"
    else
        out=$(nm say hi -o "$d/a.wav" 2>&1)
    fi
    echo "$out | file: $([ "$(state "$d/a.wav")" = "$before" ] && echo kept || echo CHANGED), leftovers: $(leftovers "$d")" | tr '\n' ' '; echo
    chmod 755 "$d"
}
expect say_read_only_folder_keeps_the_file 1 "cannot create a file in its folder: Permission denied \\| file: kept, leftovers: 0 $" -- case_say_read_only_folder

case_say_replaces_whole() {
    local d=$tmp/ok; mkdir -p "$d"; printf 'old\n' > "$d/a.wav"; chmod 600 "$d/a.wav"
    nm say hi -o "$d/a.wav"
    echo "$(stat -c '%a' "$d/a.wav") $(head -c 4 "$d/a.wav") leftovers: $(leftovers "$d")"
}
expect say_replaces_a_file_only_when_complete 0 "^600 RIFF leftovers: 0$" -- case_say_replaces_whole

case_say_through_symlink() {
    local d=$tmp/ln; mkdir -p "$d"; printf 'old\n' > "$d/target.wav"; ln -sf target.wav "$d/link.wav"
    nm say hi -o "$d/link.wav"
    echo "$(state "$d/link.wav") | $(head -c 4 "$d/target.wav")"
}
expect say_follows_a_symlink 0 "^link -> target.wav \\| RIFF$" -- case_say_through_symlink

case_say_fifo_without_reader() {
    rm -f "$tmp/out.fifo"; mkfifo "$tmp/out.fifo"
    local out; out=$(nm say hi -o "$tmp/out.fifo" 2>&1)
    echo "$out | fifo: $([ -p "$tmp/out.fifo" ] && echo kept || echo CHANGED)" | tr '\n' ' '; echo
}
expect say_fifo_without_reader 1 "a FIFO with no reader.* \\| fifo: kept $" -- case_say_fifo_without_reader

case_say_fifo_with_reader() {
    rm -f "$tmp/out2.fifo"; mkfifo "$tmp/out2.fifo"
    head -c 4 "$tmp/out2.fifo" > "$tmp/fifo.got" &
    sleep 0.2
    nm say hi -o "$tmp/out2.fifo" 2>/dev/null
    wait
    echo "read: $(cat "$tmp/fifo.got")"
}
expect say_fifo_with_reader 0 "read: RIFF$" -- case_say_fifo_with_reader

case_say_stdout() { nm say hi --stdout | head -c 4; echo; }
expect say_stdout 0 "^RIFF$" -- case_say_stdout
expect say_to_a_folder 1 "Is a directory" -- nm say hi -o "$tmp"

# ---- hangs: a FIFO where a regular file is needed --------------------------------
mkfifo "$tmp/in.fifo"
expect run_model_fifo 1 "not a regular file" -- nm run -m "$tmp/in.fifo" -p hi
expect info_fifo 1 "not a regular file" -- nm info "$tmp/in.fifo"
expect transcribe_model_fifo 1 "not a regular file" -- nm transcribe -m "$tmp/in.fifo" tests/data/speech/tts_16k.wav
expect mmproj_fifo 1 "not a regular file" "$M" -- nm run -m "$M" --mmproj "$tmp/in.fifo" --image tests/fuzz/corpus/image/420.jpg -p hi
expect image_fifo 1 "not a regular file" "$M" -- nm run -m "$M" --mmproj "$tmp/in.fifo" --image "$tmp/in.fifo" -p hi

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
