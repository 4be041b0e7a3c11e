// The formulas of the site: pymdownx.arithmatex (generic mode) leaves each one as TeX in a
// span.arithmatex (inline, \( ... \)) or div.arithmatex (display, \[ ... \]); KaTeX, copied into
// the site from the system's libjs-katex (docs/hooks.py), typesets them in the page, offline.
(function () {
  function render() {
    document.querySelectorAll(".arithmatex").forEach(function (element) {
      if (element.dataset.rendered) return;
      var tex = element.textContent.trim();
      var display = element.tagName === "DIV";
      tex = tex.replace(/^\\[(\[]/, "").replace(/\\[)\]]$/, "");
      katex.render(tex, element, {displayMode: display, throwOnError: false});
      element.dataset.rendered = "1";
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
})();
