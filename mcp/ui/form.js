// form.js: a form for a tool's arguments, generated from its input
// schema: a field per top-level property (text, number, checkbox or a
// list for an enum; JSON for anything else), and the arguments read
// back from it. Names and descriptions in the schema are shown as text.

import { el, append, clear } from './dom.js';

// build fills fieldset with a field per property of schema, and returns
// a function that reads the arguments (throwing with a message when a
// field does not parse).
export function build(fieldset, schema) {
	clear(fieldset);
	append(fieldset, el('legend', {}, 'Arguments'));
	const props = schema && typeof schema.properties === 'object' ? schema.properties : {};
	const required = new Set(Array.isArray(schema?.required) ? schema.required : []);
	const readers = [];
	const names = Object.keys(props);
	if (names.length === 0) {
		const raw = el('textarea', { rows: 3, spellcheck: 'false', 'aria-label': 'arguments (JSON)' });
		raw.value = '{}';
		append(fieldset, el('p', { class: 'hint' }, 'No declared properties: arguments as a JSON object.'), raw);
		return () => parseObject(raw.value, 'arguments');
	}
	let n = 0;
	for (const name of names) {
		const p = props[name] && typeof props[name] === 'object' ? props[name] : {};
		const id = `arg-${n++}`;
		const label = el('label', { for: id }, name, required.has(name) ? ' *' : '', p.description ? ` — ${p.description}` : '');
		const type = Array.isArray(p.type) ? p.type.find((t) => t !== 'null') : p.type;
		let input;
		let read;
		if (Array.isArray(p.enum)) {
			input = el('select', { id, name });
			if (!required.has(name)) input.appendChild(el('option', { value: '' }, '(none)'));
			p.enum.forEach((v, i) => input.appendChild(el('option', { value: String(i) }, JSON.stringify(v))));
			if (p.default !== undefined) {
				const at = p.enum.findIndex((v) => JSON.stringify(v) === JSON.stringify(p.default));
				if (at >= 0) input.value = String(at);
			}
			read = () => (input.value === '' ? undefined : p.enum[Number(input.value)]);
		} else if (type === 'boolean') {
			input = el('input', { id, name, type: 'checkbox', checked: p.default === true });
			read = () => input.checked;
		} else if (type === 'integer' || type === 'number') {
			input = el('input', { id, name, type: 'number', step: type === 'integer' ? '1' : 'any', min: p.minimum, max: p.maximum });
			if (p.default !== undefined) input.value = String(p.default);
			read = () => {
				if (input.value === '') return undefined;
				const v = Number(input.value);
				if (!Number.isFinite(v) || (type === 'integer' && !Number.isInteger(v))) throw new Error(`${name}: not ${type === 'integer' ? 'an integer' : 'a number'}`);
				return v;
			};
		} else if (type === 'string') {
			input = el('input', { id, name, type: 'text', spellcheck: 'false' });
			if (typeof p.default === 'string') input.value = p.default;
			read = () => (input.value === '' && !required.has(name) ? undefined : input.value);
		} else {
			input = el('textarea', { id, name, rows: 3, spellcheck: 'false', placeholder: 'JSON' });
			if (p.default !== undefined) input.value = JSON.stringify(p.default);
			read = () => (input.value.trim() === '' ? undefined : parseJSON(input.value, name));
		}
		append(fieldset, label, input);
		readers.push([name, read]);
	}
	return () => {
		const args = {};
		for (const [name, read] of readers) {
			const v = read();
			if (v !== undefined) args[name] = v;
		}
		return args;
	};
}

function parseJSON(text, what) {
	try {
		return JSON.parse(text);
	} catch {
		throw new Error(`${what}: not JSON`);
	}
}

function parseObject(text, what) {
	const v = parseJSON(text, what);
	if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error(`${what}: not a JSON object`);
	return v;
}
