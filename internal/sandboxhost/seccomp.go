package sandboxhost

import (
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// The seccomp filter every sandbox process runs under (bwrap --seccomp),
// built here as a classic BPF program with golang.org/x/sys/unix's
// definitions. It answers EPERM to the system calls that would let one
// sandbox reach kernel state shared with others or widen its own powers,
// and allows everything else:
//
//   - the kernel keyring (add_key, request_key, keyctl): keyrings are per
//     uid and outlive processes, so they would be a channel between
//     sandboxes sharing a uid;
//   - user namespaces (unshare, setns, clone with CLONE_NEWUSER; clone3,
//     whose flags a filter cannot read, answers ENOSYS so libc falls back
//     to clone): no nested user namespace, hence no "root" inside one;
//   - mounts (mount, umount2, pivot_root and the new mount API), kernel
//     modules, kexec, bpf, perf_event_open, userfaultfd, io_uring and
//     file handles (open_by_handle_at, name_to_handle_at).
//
// A system call of another architecture's ABI (i386 or x32 on x86-64)
// kills the process: its numbers would bypass the list.
var seccompDenied = []uintptr{
	unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEYCTL,
	unix.SYS_UNSHARE, unix.SYS_SETNS,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
}

// Offsets in struct seccomp_data.
const (
	seccompNr   = 0
	seccompArch = 4
	seccompArg0 = 16 // low 32 bits on little-endian machines
)

// x32SyscallBit marks x32 ABI system call numbers on x86-64.
const x32SyscallBit = 0x40000000

// seccompProgram returns the filter as bwrap --seccomp reads it: an array
// of struct sock_filter in the machine's byte order.
func seccompProgram() ([]byte, error) {
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return nil, fmt.Errorf("seccomp filter: unsupported architecture %s", runtime.GOARCH)
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	retErrno := func(errno unix.Errno) unix.SockFilter {
		return unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(errno)}
	}
	allow := unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW}
	kill := unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_KILL_PROCESS}

	prog := []unix.SockFilter{
		{Code: ldAbs, K: seccompArch},
		{Code: jeq, K: arch, Jt: 1},
		kill,
		{Code: ldAbs, K: seccompNr},
	}
	if runtime.GOARCH == "amd64" {
		prog = append(prog, unix.SockFilter{Code: jge, K: x32SyscallBit, Jf: 1}, kill)
	}
	// Denied calls: each "jeq nr" jumps to the shared EPERM return placed
	// right after the list (jump offsets count instructions skipped).
	for i, nr := range seccompDenied {
		prog = append(prog, unix.SockFilter{Code: jeq, K: uint32(nr), Jt: uint8(len(seccompDenied) - i + 3)})
	}
	prog = append(prog,
		// clone3: its flags live in memory the filter cannot read.
		unix.SockFilter{Code: jeq, K: unix.SYS_CLONE3, Jf: 1},
		retErrno(unix.ENOSYS),
		// clone: refuse CLONE_NEWUSER in its flags argument.
		unix.SockFilter{Code: jeq, K: unix.SYS_CLONE, Jf: 3},
		unix.SockFilter{Code: ldAbs, K: seccompArg0},
		unix.SockFilter{Code: jset, K: unix.CLONE_NEWUSER, Jt: 2},
		allow,
		allow,
		retErrno(unix.EPERM),
	)
	// Fix the denied list's jumps: from instruction j, EPERM is the last
	// instruction.
	last := len(prog) - 1
	for j := range prog {
		if prog[j].Code == jeq && prog[j].Jt > 1 {
			prog[j].Jt = uint8(last - j - 1)
		}
	}
	if len(prog) > 255 {
		return nil, fmt.Errorf("seccomp filter: %d instructions, jumps cannot reach", len(prog))
	}
	out := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.NativeEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.NativeEndian.AppendUint32(out, f.K)
	}
	return out, nil
}
