// Auto-refresh that keeps the user's place: every 30 s the page's own URL (its filters are in
// it) is fetched again and only <main> is replaced, so the scroll position stays; not while
// the user is in a form.
(function () {
  const every = Number(document.body.dataset.refresh || 0) * 1000;
  if (!every) return;
  setInterval(async function () {
    const active = document.activeElement;
    if (active && active.closest && active.closest("form")) return;
    try {
      const response = await fetch(location.href, {credentials: "same-origin"});
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("main");
      if (fresh) document.getElementById("main").replaceChildren(...fresh.childNodes);
    } catch (e) {
      /* the server is away: keep what is shown */
    }
  }, every);
})();
