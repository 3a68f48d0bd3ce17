// chart.js: a line chart of a node's metric frames, drawn by hand on a
// canvas: cpu, memory and disk as percentages over the last samples.

const series = [
	{ key: 'cpu', color: '#2d5bd7', value: (f) => f.cpu_pct },
	{ key: 'mem', color: '#d97706', value: (f) => (f.mem_total_bytes > 0 ? (100 * f.mem_bytes) / f.mem_total_bytes : 0) },
	{ key: 'disk', color: '#12805c', value: (f) => f.disk_pct },
];

// Chart keeps up to max frames and draws them on canvas.
export class Chart {
	constructor(canvas, max = 120) {
		this.canvas = canvas;
		this.max = max;
		this.frames = [];
	}

	reset() {
		this.frames = [];
		this.draw();
	}

	// add takes one metric frame (system.metrics.subscribe.frame).
	add(frame) {
		if (typeof frame?.ts_ms !== 'number') return;
		this.frames.push(frame);
		if (this.frames.length > this.max) this.frames.shift();
		this.draw();
	}

	draw() {
		const c = this.canvas;
		const ratio = window.devicePixelRatio || 1;
		const w = c.clientWidth || c.width;
		const h = c.clientHeight || c.height;
		if (c.width !== Math.round(w * ratio)) c.width = Math.round(w * ratio);
		if (c.height !== Math.round(h * ratio)) c.height = Math.round(h * ratio);
		const g = c.getContext('2d');
		g.setTransform(ratio, 0, 0, ratio, 0, 0);
		g.clearRect(0, 0, w, h);
		const pad = { l: 36, r: 10, t: 10, b: 22 };
		const pw = w - pad.l - pad.r;
		const ph = h - pad.t - pad.b;
		g.font = '11px system-ui, sans-serif';
		g.fillStyle = '#667085';
		g.strokeStyle = '#e3e6eb';
		g.lineWidth = 1;
		for (const pct of [0, 25, 50, 75, 100]) {
			const y = pad.t + ph - (ph * pct) / 100;
			g.beginPath();
			g.moveTo(pad.l, y);
			g.lineTo(pad.l + pw, y);
			g.stroke();
			g.fillText(`${pct}%`, 4, y + 4);
		}
		const fs = this.frames;
		if (fs.length === 0) {
			g.fillText('waiting for the first sample…', pad.l + 8, pad.t + ph / 2);
			return;
		}
		const t0 = fs[0].ts_ms;
		const t1 = Math.max(fs[fs.length - 1].ts_ms, t0 + 1);
		const x = (t) => pad.l + (pw * (t - t0)) / (t1 - t0);
		const y = (v) => pad.t + ph - (ph * Math.min(100, Math.max(0, v))) / 100;
		g.lineWidth = 2;
		for (const s of series) {
			g.strokeStyle = s.color;
			g.fillStyle = s.color;
			g.beginPath();
			fs.forEach((f, i) => {
				const px = fs.length === 1 ? pad.l + pw / 2 : x(f.ts_ms);
				const py = y(s.value(f));
				if (i === 0) g.moveTo(px, py);
				else g.lineTo(px, py);
			});
			g.stroke();
			const last = fs[fs.length - 1];
			g.beginPath();
			g.arc(fs.length === 1 ? pad.l + pw / 2 : x(last.ts_ms), y(s.value(last)), 3, 0, 2 * Math.PI);
			g.fill();
		}
		g.fillStyle = '#667085';
		g.fillText(new Date(t0).toLocaleTimeString(), pad.l, h - 6);
		const end = new Date(t1).toLocaleTimeString();
		g.fillText(end, pad.l + pw - g.measureText(end).width, h - 6);
	}
}
