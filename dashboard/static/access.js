// Named operator accounts (dashboard --accounts): who is asking (/api/me), the login form, and
// logging out. A viewer reads; an operator's commands go with the session cookie (no token).
// Without accounts nothing shows here and the control token works as before.
// Loaded after app.js; uses its globals (ui, updateControlForm).
"use strict";

async function loadMe() {
  try {
    const reply = await fetch("/api/me");
    if (reply.ok) ui.me = await reply.json();
  } catch (err) {
    ui.me = null; // the server went away: the page reconnects, and asks again on reload
  }
  renderWho();
}

function renderWho() {
  const me = ui.me || { accounts: false, name: null };
  const who = document.getElementById("who");
  who.hidden = !me.name;
  who.dataset.role = me.role || "";
  document.getElementById("who-name").textContent = me.name ? `${me.name} · ${me.role}` : "";
  document.getElementById("logout").hidden = me.via !== "session";
  const needed = Boolean(me.accounts && !me.name);
  document.getElementById("login-card").hidden = !needed;
  document.body.dataset.login = needed ? "needed" : "";
  updateControlForm();
}

async function logIn(event) {
  event.preventDefault();
  const result = document.getElementById("login-result");
  const body = { name: document.getElementById("login-name").value,
    password: document.getElementById("login-password").value };
  const reply = await fetch("/api/login", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!reply.ok) {
    result.dataset.state = "refused";
    result.textContent = reply.status === 401 ? "wrong account name or password" : `refused (${reply.status})`;
    return;
  }
  location.reload(); // the page's socket and views start again, as this account
}

async function logOut() {
  await fetch("/api/logout", { method: "POST" });
  location.reload();
}

document.getElementById("login-form").addEventListener("submit", logIn);
document.getElementById("logout").addEventListener("click", logOut);
loadMe();
