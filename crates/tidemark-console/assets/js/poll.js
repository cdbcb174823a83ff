// A view's refresh, run every few seconds while the view is on screen: never two at once
// (a slow server gets one request at a time from each view, not a pile of them), and
// starting it again while it runs does nothing.

export function poller(refresh, intervalMs) {
  let timer = null;
  let busy = false;
  const tick = async () => {
    if (busy) return;
    busy = true;
    try {
      await refresh();
    } finally {
      busy = false;
    }
  };
  return {
    start() {
      if (timer !== null) return;
      tick();
      timer = setInterval(tick, intervalMs);
    },
    stop() {
      clearInterval(timer);
      timer = null;
    },
    /** Refreshes now (after an action), unless a refresh is already running. */
    now: tick,
  };
}
