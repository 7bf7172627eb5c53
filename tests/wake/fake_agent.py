"""A stand-in for an agent CLI at its prompt, for the waker's tests
(tests/it/wake.rs): it runs `loopx hook` as Claude Code does (its JSON on
stdin) at session start, on each submitted prompt and at each turn's end,
reads prompts from its terminal with bracketed paste on (a pasted text,
line breaks included, is one prompt; Enter submits it), answers each with
"Echo: <prompt>", and keeps a Stop hook's block as its next prompt (with no
UserPromptSubmit, as Claude Code goes on with a block). A
prompt that says "please ask first" shows a dialog mid-turn that one key
answers, as an approval prompt does.
Every prompt it got is appended to PROMPTS_FILE, one JSON string a line.

Usage: python3 fake_agent.py LOOPX PROMPTS_FILE [HOOK FLAGS...]
"""
import json, os, shlex, subprocess, sys, termios, tty, uuid

loopx, prompts_file, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
session = str(uuid.uuid4())
transcript = prompts_file + ".transcript"

def hook(event, name, **fields):
    doc = {"session_id": session, "cwd": os.getcwd(), "hook_event_name": name,
           "transcript_path": transcript, "permission_mode": "default", **fields}
    # As Claude Code runs a hook: `/bin/sh -c`, in a session of its own with
    # no terminal.
    command = " ".join(shlex.quote(a) for a in [loopx, "hook", event, "--agent", "claude-code", *flags])
    out = subprocess.run(["/bin/sh", "-c", command], input=json.dumps(doc),
                         capture_output=True, text=True, start_new_session=True)
    return out.stdout.strip()

def read_prompt():
    """One prompt: keys until Enter outside a paste."""
    text, pasting, buf = "", False, b""
    while True:
        ch = os.read(0, 1)
        if not ch:
            sys.exit(0)
        buf += ch
        if buf.startswith(b"\x1b"):
            if buf == b"\x1b[200~": pasting, buf = True, b""
            elif buf == b"\x1b[201~": pasting, buf = False, b""
            elif len(buf) >= 6: buf = b""
            continue
        c = buf.decode(errors="replace"); buf = b""
        if c == "\x04" and not text:
            sys.exit(0)
        if c in "\r\n" and not pasting:
            return text
        text += "\n" if c in "\r\n" else c
        # Echoed as Claude Code draws its prompt: what is typed shows in it.
        sys.stdout.write("\r\n  " if c in "\r\n" else c); sys.stdout.flush()

# Raw before the first hook says the agent is there: a test types at once,
# and keys typed while the terminal was still cooked would be echoed by it
# (and flushed by a TCSAFLUSH).
old = termios.tcgetattr(0)
tty.setraw(0, termios.TCSANOW)
hook("session-start", "SessionStart", source="startup")
sys.stdout.write("\x1b[?2004h\u276f\u00a0"); sys.stdout.flush()
try:
    while True:
        prompt = read_prompt()
        if prompt.strip() == "/exit":
            break
        typed = True
        while prompt is not None:
            with open(prompts_file, "a") as f:
                f.write(json.dumps(prompt) + "\n")
            if typed:
                # Claude Code runs UserPromptSubmit for a prompt submitted at
                # its terminal, not for a Stop hook's block it goes on with.
                hook("user-prompt-submit", "UserPromptSubmit", prompt=prompt)
            typed = False
            if "please ask first" in prompt:
                # A dialog mid-turn, as an approval prompt: one key answers it.
                sys.stdout.write("\r\nAllow this? [y/n] "); sys.stdout.flush()
                key = os.read(0, 1).decode(errors="replace")
                with open(prompts_file, "a") as f:
                    f.write(json.dumps("dialog answered: " + key) + "\n")
            answer = "Echo: " + prompt
            with open(transcript, "a") as f:
                f.write(json.dumps(answer) + "\n")
            sys.stdout.write("\r\n" + answer.replace("\n", "\r\n") + "\r\n"); sys.stdout.flush()
            out = hook("stop", "Stop", stop_hook_active=False, last_assistant_message=answer)
            prompt = json.loads(out)["reason"] if out else None
        sys.stdout.write("\u276f\u00a0"); sys.stdout.flush()
finally:
    sys.stdout.write("\x1b[?2004l\r\n"); sys.stdout.flush()
    termios.tcsetattr(0, termios.TCSADRAIN, old)
    hook("session-end", "SessionEnd", reason="other")
