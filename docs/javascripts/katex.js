// Render $...$ and $$...$$ with the KaTeX copy the build put under vendor/katex (no CDN).
const katexOptions = {
  delimiters: [
    { left: "$$", right: "$$", display: true },
    { left: "$", right: "$", display: false },
    { left: "\\(", right: "\\)", display: false },
    { left: "\\[", right: "\\]", display: true },
  ],
  throwOnError: false,
  errorColor: "#cc0000",
};

// mkdocs-jupyter may typeset notebook cells through window.MathJax; this shim hands them to
// the local KaTeX instead, so no MathJax is ever fetched.
window.MathJax = {
  startup: { promise: Promise.resolve() },
  typesetPromise: async (nodes) =>
    (nodes || [document.body]).forEach((n) => renderMathInElement(n, katexOptions)),
  typesetClear() {},
  texReset() {},
};

document$.subscribe(({ body }) => renderMathInElement(body, katexOptions));
