// Greeter (com.example.greeter): "Bonjour, <name>!" for each input item's title (see GreeterKit).
import GreeterKit
import SDKExtension

@main
struct Greeter {
    static func main() { GreeterHandler.main() }
}
