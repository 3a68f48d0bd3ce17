// dom.js: the one way the dashboard makes elements. Data only ever
// becomes text nodes (createTextNode) or the value of an attribute from
// a fixed list; nothing here parses markup. The page's CSP requires
// Trusted Types, so an HTML sink given a string would throw anyway.

// Attributes el may set: none of them runs script or loads anything.
const safeAttrs = new Set([
	'class', 'id', 'type', 'value', 'title', 'for', 'name', 'placeholder', 'list', 'min', 'max', 'step',
	'aria-label', 'role', 'colspan', 'data-node', 'data-tool', 'spellcheck', 'autocomplete', 'rows',
]);

// el returns a new element with attributes attrs (those of safeAttrs;
// booleans for hidden, disabled, checked, required) and children: nodes,
// or anything else as its text.
export function el(tag, attrs = {}, ...children) {
	const e = document.createElement(tag);
	for (const [k, v] of Object.entries(attrs)) {
		if (v === undefined || v === null || v === false) continue;
		if (k === 'hidden' || k === 'disabled' || k === 'checked' || k === 'required') {
			e[k] = Boolean(v);
		} else if (safeAttrs.has(k)) {
			e.setAttribute(k, String(v));
		} else {
			throw new Error(`dom: attribute ${k} is not allowed`);
		}
	}
	append(e, ...children);
	return e;
}

// append adds children to parent: nodes as they are, anything else as text.
export function append(parent, ...children) {
	for (const c of children.flat()) {
		if (c === undefined || c === null || c === false) continue;
		parent.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
	}
	return parent;
}

// setText replaces what e holds with text.
export function setText(e, text) {
	e.textContent = text === undefined || text === null ? '' : String(text);
}

// clear empties e.
export function clear(e) {
	e.replaceChildren();
}

export const $ = (id) => document.getElementById(id);

// ago says how long before now the time t (RFC 3339 or ms) was, in words.
export function ago(t) {
	const ms = typeof t === 'number' ? t : Date.parse(t);
	if (!Number.isFinite(ms)) return '';
	const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
	if (s < 60) return `${s}s ago`;
	if (s < 3600) return `${Math.floor(s / 60)}m ago`;
	if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
	return `${Math.floor(s / 86400)}d ago`;
}
