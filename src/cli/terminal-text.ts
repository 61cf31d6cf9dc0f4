/**
 * Text for a person's terminal, from a source we do not control (a model's words, a tool's output, an engine's
 * finish reason, a server's error message): every control character but newline and tab is shown in a visible
 * escaped form (`\x1b`, `\x9b`, `\u202e`), so none reaches the terminal as a control. Raw, an observation holding
 * `\x1b]52;c;...\x07` wrote the operator's clipboard, `\x1b[2J` cleared the screen, `\x1b]0;...\x07` retitled the
 * window, `\x1b]8;;url\x07` hid a link behind text, and a carriage return or a bidi override made text show other
 * than it is. Escaped: C0 (but \n and \t), DEL, C1 (U+0080–U+009F: 8-bit CSI/OSC for terminals that take them) and
 * the Unicode bidi embedding/override/isolate controls. Backslashes are left as they are (code in a transcript stays
 * readable), so the form is for reading, not for parsing back: machine output (JSONL, the JSON logs) is never passed
 * through this.
 */
export function forTerminal(text: string): string {
  return text.replace(CONTROL, escapeChar);
}

/**
 * {@link forTerminal} for text that must stay on one line of a table or a progress line (a backend's id, url or
 * reason, a build tool's progress message): line breaks and tabs are escaped too, so a value cannot start a row or a
 * line of its own.
 */
export function forTerminalLine(text: string): string {
  return forTerminal(text).replace(/[\n\t]/g, (c) => (c === '\n' ? '\\n' : '\\t'));
}

const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;

function escapeChar(c: string): string {
  const code = c.charCodeAt(0);
  return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
}
