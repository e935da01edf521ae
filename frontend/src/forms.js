/* ReclaimNet form helpers, loaded on every page (no inline scripts: the Content-Security-Policy allows scripts
 * from the portal only, docs/design.md §9.9). Each behaviour is declared in the markup:
 *   <form data-confirm="Question?">     asks before submitting; Cancel keeps the form unsent.
 *   <button data-copy="ELEMENT_ID">     copies that element's text (or selects it when the clipboard is closed).
 *   <input data-notice="SECONDS">       a reclaim notice preset: choosing it fills #id_notice_s; typing in the
 *                                       field checks the preset with the same value, if any.
 *   <button data-use-notice="SECONDS">  fills #id_notice_s with that value (a suggested notice).
 */
(function () {
  "use strict";

  document.addEventListener("submit", function (e) {
    var form = e.target.closest ? e.target.closest("form[data-confirm]") : null;
    if (form && !window.confirm(form.getAttribute("data-confirm"))) e.preventDefault();
  }, true);

  document.addEventListener("click", function (e) {
    if (!e.target.closest) return;
    var copy = e.target.closest("[data-copy]");
    if (copy) {
      var pre = document.getElementById(copy.getAttribute("data-copy"));
      (navigator.clipboard ? navigator.clipboard.writeText(pre.textContent) : Promise.reject()).then(
        function () { copy.textContent = "Copied"; },
        function () { window.getSelection().selectAllChildren(pre); copy.textContent = "Selected: press Ctrl+C"; });
      return;
    }
    var use = e.target.closest("[data-use-notice]");
    var input = document.getElementById("id_notice_s");
    if (use && input) {
      input.value = use.getAttribute("data-use-notice");
      input.dispatchEvent(new Event("input", { bubbles: true }));
      input.dispatchEvent(new Event("change", { bubbles: true }));
    }
  });

  // Capture phase: the field must hold the preset before htmx (listening on the form) sends the preview request.
  document.addEventListener("change", function (e) {
    var input = document.getElementById("id_notice_s");
    if (input && e.target.matches && e.target.matches("input[data-notice]")) {
      input.value = e.target.getAttribute("data-notice");
    }
  }, true);

  document.addEventListener("input", function (e) {
    if (e.target.id !== "id_notice_s") return;
    document.querySelectorAll("input[data-notice]").forEach(function (r) {
      r.checked = r.getAttribute("data-notice") === e.target.value;
    });
  });
})();
