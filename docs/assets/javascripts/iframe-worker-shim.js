/* geolens docs: a Web Worker for pages opened from disk (file://).
 *
 * Browsers refuse `new Worker(url)` for file:// URLs, and the theme's search runs in a worker. Opened
 * from disk, this stand-in runs the worker's script in a hidden iframe of the same page instead and
 * passes messages both ways (postMessage, onmessage / addEventListener, terminate): what the search
 * worker needs. Served over http(s), the browser's own Worker is used. mkdocs.yml loads it as the
 * theme's iframe-worker polyfill, so nothing is fetched from the network.
 */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  function FileWorker(url) {
    var worker = this;
    this.onmessage = null;
    this.onerror = null;
    this._listeners = { message: [], error: [] };
    this._queue = [];
    this._ready = false;
    var iframe = document.createElement("iframe");
    iframe.style.display = "none";
    iframe.setAttribute("aria-hidden", "true");
    iframe.setAttribute("tabindex", "-1");
    (document.body || document.documentElement).appendChild(iframe);
    this._iframe = iframe;
    var scope = iframe.contentWindow;
    // Inside the worker's script, the global postMessage answers the page.
    scope.postMessage = function (data) {
      setTimeout(function () { worker._emit("message", new MessageEvent("message", { data: data })); }, 0);
    };
    scope.importScripts = function () {
      throw new Error("importScripts is not available to a worker opened from disk");
    };
    var script = scope.document.createElement("script");
    script.src = new URL(String(url), document.baseURI).href;
    script.onload = function () {
      worker._ready = true;
      var queued = worker._queue;
      worker._queue = [];
      queued.forEach(function (data) { worker.postMessage(data); });
    };
    script.onerror = function () {
      worker._emit("error", new ErrorEvent("error", { message: "could not load worker script " + script.src }));
    };
    scope.document.head.appendChild(script);
  }

  FileWorker.prototype.postMessage = function (data) {
    if (!this._ready) { this._queue.push(data); return; }
    var scope = this._iframe.contentWindow;
    setTimeout(function () { scope.dispatchEvent(new scope.MessageEvent("message", { data: data })); }, 0);
  };
  FileWorker.prototype.addEventListener = function (type, listener) {
    (this._listeners[type] = this._listeners[type] || []).push(listener);
  };
  FileWorker.prototype.removeEventListener = function (type, listener) {
    var list = this._listeners[type] || [];
    var at = list.indexOf(listener);
    if (at >= 0) list.splice(at, 1);
  };
  FileWorker.prototype.terminate = function () {
    if (this._iframe.parentNode) this._iframe.parentNode.removeChild(this._iframe);
  };
  FileWorker.prototype._emit = function (type, event) {
    var handler = this["on" + type];
    if (typeof handler === "function") handler.call(this, event);
    (this._listeners[type] || []).slice().forEach(function (listener) { listener.call(this, event); }, this);
  };

  window.Worker = FileWorker;
})();
