# The watchdog as a static Linux x86-64 executable: what watchdogScript
# does, in 88 instructions and no library, so that it costs a page or two
# of memory instead of a shell's 1.7 MiB. build.sh assembles it into
# ../watchdog_linux_amd64.bin, which the signals package embeds.
#
# fd 3 is its socket to leaderrun. It ignores every signal that can be
# ignored, names itself, says "ready", then reads lines: "pgid N" names the
# command's process group, "done" dismisses it (exit 0). When the socket
# closes (or fails) without "done", leaderrun is gone: it sends SIGKILL to
# group N, if it was told one, and exits. Lines it does not know, and
# lines of 64 bytes or more, are ignored.

	.intel_syntax noprefix
	.globl _start
	.text
_start:
	mov	r12d, 1			# for every signal 1..64:
1:	mov	eax, 13			#   rt_sigaction(sig, &ignore, NULL, 8)
	mov	edi, r12d		#   (SIGKILL, SIGSTOP: EINVAL, as they must)
	lea	rsi, [rip + ignore]
	xor	edx, edx
	mov	r10d, 8
	syscall
	inc	r12d
	cmp	r12d, 65
	jb	1b
	mov	eax, 157		# prctl(PR_SET_NAME, name): its name in ps
	mov	edi, 15
	lea	rsi, [rip + name]
	syscall
	mov	eax, 1			# write(3, "ready\n", 6)
	mov	edi, 3
	lea	rsi, [rip + ready]
	mov	edx, 6
	syscall
	sub	rsp, 256		# [rsp, +128): what read returned; [rsp+128, +64): the line
	xor	r13d, r13d		# r13: the group, 0 until told
	xor	r14d, r14d		# r14: the line's length so far
read:
	xor	eax, eax		# read(3, rsp, 128)
	mov	edi, 3
	mov	rsi, rsp
	mov	edx, 128
	syscall
	cmp	rax, -4			# EINTR: again
	je	read
	test	rax, rax		# end of file or an error: leaderrun is gone
	jle	gone
	mov	r15, rax
	xor	ecx, ecx
scan:
	cmp	rcx, r15
	jae	read
	movzx	eax, byte ptr [rsp + rcx]
	inc	rcx
	cmp	al, 10
	je	line
	cmp	r14, 64
	jae	toolong
	mov	[rsp + 128 + r14], al
toolong:
	inc	r14			# counts on: a long line is never matched
	jmp	scan
line:
	cmp	r14, 4			# "done"
	jne	pgid
	cmp	dword ptr [rsp + 128], 0x656e6f64
	je	exit
pgid:
	cmp	r14, 6			# "pgid " and 1 to 58 digits
	jb	next
	cmp	r14, 64
	jae	next
	cmp	dword ptr [rsp + 128], 0x64696770
	jne	next
	cmp	byte ptr [rsp + 132], 32
	jne	next
	xor	edx, edx
	mov	r8d, 5
digit:
	cmp	r8, r14
	jae	store
	movzx	eax, byte ptr [rsp + 128 + r8]
	sub	eax, 48
	cmp	eax, 9
	ja	next			# not a number: ignored
	imul	rdx, rdx, 10
	add	rdx, rax
	cmp	rdx, 0x7fffffff		# no pid is larger
	ja	next
	inc	r8
	jmp	digit
store:
	mov	r13, rdx
next:
	xor	r14d, r14d
	jmp	scan
gone:
	test	r13, r13
	jz	exit
	mov	eax, 62			# kill(-group, SIGKILL)
	mov	rdi, r13
	neg	rdi
	mov	esi, 9
	syscall
exit:
	mov	eax, 231		# exit_group(0)
	xor	edi, edi
	syscall

ignore:	.quad	1, 0, 0, 0		# struct sigaction: SIG_IGN, no flags, no restorer, empty mask
name:	.asciz	"leaderrun-dog"
ready:	.ascii	"ready\n"
