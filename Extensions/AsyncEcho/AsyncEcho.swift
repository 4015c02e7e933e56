// AsyncEcho (com.example.async-echo): an async handler. The first item's title picks the behaviour:
//   "sleep:<ms>"  await Task.sleep, then echo; a host cancel cancels the Task and the request ends cancelled
//   "forget"      return without finishing (the runtime reports it, cancelled with an SDKExtension error)
//   "hold-task"   complete, then start a Task that never ends and holds the context (a leak the runtime reports)
//   "linger"      complete, then keep this handler's own Task running for good (reported: context and task)
//   anything else echo at once
import SDKExtension

@main
struct AsyncEcho: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        let command = context.inputItems.first?.title ?? ""
        if command == "forget" { return }
        if command.hasPrefix("sleep:"), let ms = UInt64(command.dropFirst(6)) {
            do {
                try await Task.sleep(nanoseconds: ms * 1_000_000)
            } catch {
                // Cancelled by the host: the runtime finishes the request as cancelled when we return.
                return
            }
        }
        context.completeRequest(returningItems: context.inputItems)
        if command == "hold-task" {
            // The classic capture: an observation loop started from a request and never cancelled.
            Task {
                while true {
                    try? await Task.sleep(nanoseconds: 60_000_000_000)
                    _ = context.inputItems.count
                }
            }
        } else if command == "linger" {
            while true { try? await Task.sleep(nanoseconds: 60_000_000_000) }
        }
    }
}
